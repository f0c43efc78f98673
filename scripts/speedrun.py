"""The speedrun: each recipe trained for the same wall-clock budget on seeds 0..N-1, judged against the reference.

Usage: python scripts/speedrun.py --lock /tmp/minillama-cpu.lock    # every recipe, 2 seeds, 10 min each
       python scripts/speedrun.py --dry-run                          # the plan and its cost only
Every option: --help. The program itself is cli/speedrun.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.speedrun import STOPPED, main

if __name__ == "__main__":
    run(main, interrupted=STOPPED)
