"""Mutation score per target of scripts/mutation.sh, from mutmut's results in mutants/.

Usage: python scripts/mutation_score.py [--survivors] [--dir mutants] [--doc docs/testing.md]
Every option: --help. The program itself is devtools/mutation_score.py; this file is its door.
"""

import _bootstrap  # noqa: F401  (the repository root on sys.path)

from cli import run
from devtools.mutation_score import main

if __name__ == "__main__":
    run(main)
