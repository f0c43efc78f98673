"""`python scripts/x.py` puts scripts/ first on sys.path, not the repository: this puts the repository root there
too, so a program finds the framework's packages from any working directory; importing `training` then checks
TORCHINDUCTOR_CACHE_DIR before the program imports the model. Every program imports it first."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import training  # noqa: F401
