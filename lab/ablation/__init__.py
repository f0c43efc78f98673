"""The ablation protocol (lab/ablate.py): protocol.py, lr_search.py (the LR rule), configs.py (cells as train.py
configs), registration.py (its record), runner.py (the stages), contrasts.py (the verdicts), report.py (the results)."""
