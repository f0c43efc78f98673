"""What trust costs: saving a checkpoint, and hashing it against its manifest on load, per model size.

Usage: python scripts/bench_checkpoint.py [--models cpu,25m,125m] [--repeats 3]
Every option: --help. The program itself is devtools/bench/checkpoint.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.checkpoint import main

if __name__ == "__main__":
    run(main)
