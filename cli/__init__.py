"""The edge: Hydra config → typed config (config.py), and the programs behind scripts/ — one module
per program, its arguments and orchestration, calling the library packages."""
from pathlib import Path

from cli.entry import inductor_cache_problem

REPO = Path(__file__).resolve().parents[1]  # configs/, train.py and BENCHMARKS.md live here

if (_problem := inductor_cache_problem()) is not None:  # before any program imports the model (cli/entry.py)
    raise SystemExit(f"error: {_problem}")
