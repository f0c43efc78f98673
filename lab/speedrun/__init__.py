"""The speedrun: every recipe trained for the same wall-clock budget on paired seeds and judged
against the reference. spec.py reads the recipes, timing.py holds the calibration arithmetic,
campaign.py runs the probes and the runs, report.py writes report.md (lab/speedrun_campaign.py)."""

from lab.speedrun.spec import NAME, RESERVED, Spec, SpeedrunError, load_spec
from lab.speedrun.timing import (
    SLOW_FRACTION,
    Timing,
    n_evals,
    n_saves,
    predict_loop_s,
    probe_overrides,
    run_flags,
    scaled,
    steady_tokens_per_s,
    steps_for_budget,
    timing_from_probe,
)

__all__ = [
    "NAME",
    "RESERVED",
    "SLOW_FRACTION",
    "SpeedrunError",
    "Spec",
    "Timing",
    "load_spec",
    "n_evals",
    "n_saves",
    "predict_loop_s",
    "probe_overrides",
    "run_flags",
    "scaled",
    "steady_tokens_per_s",
    "steps_for_budget",
    "timing_from_probe",
]
