"""Ablation studies: reading finished runs and judging them (scripts/compare_runs.py), and the
protocol that trains every variant at its own best learning rate on paired seeds (scripts/ablate.py)."""
