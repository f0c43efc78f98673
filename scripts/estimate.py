"""Know before you launch: parameters, memory, FLOPs and time per step of a training config, and whether it fits.

Usage: python scripts/estimate.py [overrides as for train.py ...] [--device cpu|cuda] [--device-memory-gb G] …
e.g.   python scripts/estimate.py model=125m trainer=gpu --device cuda --device-memory-gb 80
Every option: --help. The program itself is cli/estimate.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.estimate import main

if __name__ == "__main__":
    run(main)
