"""Muon's Newton–Schulz in bf16 against fp32 at a run's matrix shapes: time, and what bf16 changes in the result.

Usage: python scripts/bench_newton_schulz.py [OVERRIDE ...] [--repeats 7] [--threads 2]
Every option: --help. The program itself is devtools/bench/newton_schulz.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.newton_schulz import main

if __name__ == "__main__":
    run(main)
