"""Generation speed: minillama with and without the KV cache vs HF `generate` on the exported copy, same run.

Usage: python scripts/bench_generate.py [--checkpoint CKPT] [--new-tokens 256] [--no-hf] [--write] …
Every option: --help. The program itself is devtools/bench/generate.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.bench.generate import main

if __name__ == "__main__":
    run(main)
