"""The lab: studies that train many runs (ablation/ and ablate.py; μP's coord_check.py, mup_transfer.py) over one sweep
driver and stats.py. It imports the framework, never the reverse; its Hydra configs join train.py's via SEARCH_PATH."""

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
SEARCH_PATH = f"hydra.searchpath=[file://{CONFIGS}]"  # an override every lab composition and launch carries
