"""The ablation protocol: every variant at its own best learning rate on paired seeds, at one or more
model sizes (scripts/ablate.py). protocol.py says what it trains, configs.py turns cells into train.py
configs, runner.py runs the stages, cells.py reads where each cell stands, cost.py what is left,
manifest.py the protocol directory's record, report.py the results."""
