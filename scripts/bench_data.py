"""Benchmark the data pipeline: cold Shakespeare preparation, its phases, a cache hit, and batch loading.

Usage: python scripts/bench_data.py [--repeats 3] [--no-model] [--corpus-mb 30] [--write]
Every option: --help. The program itself is devtools/bench/data.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.data import main

if __name__ == "__main__":
    run(main)
