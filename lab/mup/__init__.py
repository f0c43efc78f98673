"""The μP studies (docs/mup.md): the coordinate check (coord_check.py), the learning-rate transfer
experiment across widths (transfer.py, its report in transfer_report.py), and their figures (plots.py)."""
