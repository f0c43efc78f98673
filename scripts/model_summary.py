"""Print a model config's parameter breakdown, training FLOPs per token, and the SwiGLU width reasoning.

Usage: python scripts/model_summary.py [model=cpu|tiny|25m|125m] [hidden_size=4096 multiple_of=256 ...]
Every option: --help. The program itself is cli/model_summary.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.model_summary import main

if __name__ == "__main__":
    run(main)
