"""Loop overhead: train.py's real loop vs the bare step (loss, backward, clip, optimizer) at the same settings.

Usage: python scripts/bench_train_overhead.py [--steps 60] [--threads 2] [overrides ...]
Every option: --help. The program itself is devtools/bench/train_overhead.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.train_overhead import main

if __name__ == "__main__":
    run(main)
