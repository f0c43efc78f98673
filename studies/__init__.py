"""The studies: what runs many trainings and judges them — the launcher (`jobs.py`), the ablation protocol
(`ablation/`), the speedrun (`speedrun/`) and μP's experiments (`mup/`). The statistics, run reading, tables
and plots they use are analysis/'s."""
