"""Where train.py's step goes by op group against the machine's roofs, and levers (Hydra overrides, inductor
options) timed side by side.

Usage: python scripts/bench_roofline.py [OVERRIDE ...] [--variant "OVERRIDE ..."]...
       [--inductor-variant "NAME=VALUE ..."]... [--steps 20] [--profile-steps 5]
Every option: --help. The program itself is devtools/bench/roofline.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.roofline import main

if __name__ == "__main__":
    run(main)
