"""Peak memory and time of CausalLMLoss's one-shot vs chunked cross-entropy at a real vocabulary, on CPU.

Usage: python scripts/bench_loss.py [--vocab 32768] [--batch 8] [--seq 512] [--hidden 256] [--layers 2] [--steps 3]
Every option: --help. The program itself is devtools/bench/loss.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.loss import main

if __name__ == "__main__":
    run(main)
