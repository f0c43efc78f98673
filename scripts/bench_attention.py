"""Each attention kernel alone at a run's shape, compiled: forward, and forward + backward, side by side.

Usage: python scripts/bench_attention.py [OVERRIDE ...] [--rounds 7] [--iters 10] [--precision bf16] [--threads 2]
Every option: --help. The program itself is devtools/bench/attention.py; this file is its door.
"""
import _bootstrap  # noqa: F401  (the repository root on sys.path)
from cli.entry import run
from devtools.bench.attention import main

if __name__ == "__main__":
    run(main)
