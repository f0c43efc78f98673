"""`python scripts/x.py` puts scripts/ first on sys.path, not the repository: this puts the repository
root there too, so a script finds cli/ and the packages from any working directory. The one sys.path
edit of the tree; every script imports it first."""

import sys
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
