"""Reading finished runs (runs.py) and judging them (stats.py: the paired verdict; table.py, reference.py, plots)
for scripts/compare_runs.py; the lab builds its studies on the same verdict."""
