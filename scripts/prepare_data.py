"""Build (or find) the token cache for a data config, outside of training, and report what it holds.

Usage: python scripts/prepare_data.py [Hydra overrides, as for train.py]
e.g.   python scripts/prepare_data.py data=local data.path='my/*.txt' data.vocab_size=8192
Every option: --help. The program itself is cli/prepare_data.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.prepare_data import main

if __name__ == "__main__":
    run(main)
