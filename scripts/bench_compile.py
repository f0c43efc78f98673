"""Where torch.compile's speed-up comes from: what is inside the compiled region, side by side in one process.

Usage: python scripts/bench_compile.py [--steps 8] [--warmup 2] [--precision auto|bf16|fp32] [--threads 2]
Every option: --help. The program itself is devtools/bench/compile.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.compile import main

if __name__ == "__main__":
    run(main)
