"""Export a checkpoint as a Hugging Face LlamaForCausalLM directory (model, config, tokenizer).

Usage: python scripts/export_hf.py CHECKPOINT|RUN_DIR|latest OUT_DIR [--force]
Every option: --help. The program itself is cli/export_hf.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.export_hf import main

if __name__ == "__main__":
    run(main, also=(ImportError,))
