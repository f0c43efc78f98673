"""The lab: studies that train many runs — the ablation protocol (ablation/, ablate.py), μP's coordinate check and
transfer sweep (coord_check.py, mup_transfer.py) — with their statistics (stats.py), programs (`python -m lab.<program>`),
configs and tests. It imports the framework; the framework never imports it. Its Hydra configs (lab/configs: the
studies' presets and protocols) join train.py's through SEARCH_PATH."""

from pathlib import Path

CONFIGS = Path(__file__).resolve().parent / "configs"
SEARCH_PATH = f"hydra.searchpath=[file://{CONFIGS}]"  # an override every lab composition and launch carries
