"""Reading finished runs and judging them against each other: used by scripts/compare_runs.py."""
