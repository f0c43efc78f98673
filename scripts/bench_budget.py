"""Does a time-budgeted run land on its budget when busy processes start and stop mid-run?

Usage: python scripts/bench_budget.py [--minutes 3] [--hogs 1] [--hog-from 0.3] [--hog-until 0.6] [--repo DIR]
Every option: --help. The program itself is devtools/bench/budget.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.budget import main

if __name__ == "__main__":
    run(main)
