"""μP's learning-rate transfer experiment: SP and μP, AdamW and Muon, widths × a ×2 lr grid × seeds.

Usage: python scripts/mup_transfer.py --dir DIR --dry-run   # the plan and its estimated time
       python scripts/mup_transfer.py --dir DIR [--jobs 2]  # run; the same command again continues
       python scripts/mup_transfer.py --dir DIR --report    # table and figure of what has finished
Every option: --help. The program itself is cli/mup/transfer.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.mup.transfer import main

if __name__ == "__main__":
    run(main)
