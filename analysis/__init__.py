"""Studies of finished runs: reading them (runs.py), judging them (stats.py, table.py, reference.py,
scale.py, plots) for scripts/compare_runs.py, and the two studies that also train, each a
subpackage — the ablation protocol (ablation/) and the speedrun (speedrun/) — with their one
launcher of train.py jobs (jobs.py)."""
