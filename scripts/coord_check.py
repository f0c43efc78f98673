"""μP's coordinate check: activation RMS against width over a few training steps, SP and μP side by side.

Usage: python scripts/coord_check.py [--widths 64,128,256,512,1024] [--steps 10] [--out coord_check.png]
Every option: --help. The program itself is cli/mup/coord_check.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.mup.coord_check import main

if __name__ == "__main__":
    run(main)
