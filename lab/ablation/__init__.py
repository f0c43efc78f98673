"""The ablation protocol: pre-registered contrasts, every variant at its own best learning rate and at the
reference's on paired seeds, at one or more model sizes (lab/ablate.py). protocol.py says what it
trains and how it is judged, lr_search.py how an LR is chosen, configs.py turns cells into train.py
configs, runner.py runs the stages on lab/sweep.py, cells.py reads where each cell stands, planning.py what
is left and what it can detect, manifest.py the protocol directory's record, report.py the results
(contrasts.py the verdicts and the scale check, export.py the data files; the report compares them with the papers)."""
