"""Generate text from a checkpoint: prompts from the command line, files or stdin, streamed to the terminal.

Usage: python scripts/generate.py CHECKPOINT|RUN_DIR|latest --prompt TEXT [--max-new-tokens N] [--temperature T] …
e.g.   python scripts/generate.py latest --prompt 'ROMEO:' --max-new-tokens 200 --seed 0
Every option: --help. The program itself is cli/generate.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from cli.generate import main

if __name__ == "__main__":
    run(main)
