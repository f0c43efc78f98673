"""Studies of finished runs: reading them (runs.py), judging them (stats.py, table.py, reference.py,
scale.py, plots; verdicts.py: Holm and TOST over a family; power.py: what n seeds can detect; looks.py:
no seed added after a look) for scripts/compare_runs.py, and the two studies that also train, each a
subpackage — the ablation protocol (ablation/) and the speedrun (speedrun/) — with their one
launcher of train.py jobs (jobs.py)."""
