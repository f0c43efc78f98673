"""Import a Hugging Face Llama model directory (safetensors + tokenizer.json) as a minillama checkpoint.

Usage: python scripts/import_hf.py HF_DIR RUN_DIR
Every option: --help. The program itself is cli/import_hf.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.import_hf import main

if __name__ == "__main__":
    run(main)
