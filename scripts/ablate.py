"""Run an ablation protocol end to end: every variant at its own best learning rate, paired seeds, then the report.

Usage: python scripts/ablate.py [--dry-run]                          # configs/protocol/default.yaml
       python scripts/ablate.py --dir multirun/ablate/<date>/<time>   # resume
Every option: --help. The program itself is cli/ablate.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.ablate import main

if __name__ == "__main__":
    run(main)
