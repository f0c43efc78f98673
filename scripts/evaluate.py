"""Bits per byte, loss and perplexity of a checkpoint on a whole held-out split or text file: every token, once.

Usage: python scripts/evaluate.py CHECKPOINT|RUN_DIR|latest|HF_LLAMA_DIR [--data NAME|CONFIG.yaml|CACHE_DIR]
         [--text FILE ...] [--context N] [--stride S] [--json OUT] …
Every option: --help. The program itself is cli/evaluate.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.evaluate import main

if __name__ == "__main__":
    run(main)
