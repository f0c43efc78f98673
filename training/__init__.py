"""Training helpers used by train.py: config schemas, optimizer and schedule, checkpoints, distributed."""
