"""The edge: Hydra config → typed config (config.py), and the programs behind scripts/ — one module
per program, its arguments and orchestration, calling the library packages."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]  # configs/, train.py and BENCHMARKS.md live here
