"""Compare finished runs: a markdown table (mean ± std over seeds), paired Δ against a reference variant.

Usage: python scripts/compare_runs.py multirun/<date>/<time> [more run or sweep dirs] [--out DIR]
           [--reference model.norm=rmsnorm model.mlp=swiglu]
Every option: --help. The program itself is cli/compare_runs.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.compare_runs import main

if __name__ == "__main__":
    run(main)
