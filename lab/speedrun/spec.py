"""The speedrun's recipes file (lab/configs/speedrun/recipes.yaml): each recipe's train.py overrides, the
reference, the wall-clock budget, the seeds and the probe, checked when it is read."""

import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List

from lab.spec_file import read_spec_fields

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")  # names the recipe's directory
# Set by the speedrun itself for every run: the calibrated length, the paired seed, where it lives.
RESERVED = ("trainer.max_steps", "trainer.stop_at_step", "seed", "resume", "hydra.")


class SpeedrunError(ValueError):
    """Bad speedrun input: the message is one line that names the value and what would be right."""


@dataclass
class Spec:
    recipes: Dict[str, List[str]]  # name → train.py overrides on top of the defaults
    reference: str = "baseline"  # every recipe is judged against this one
    budget_s: float = 600.0  # the training loop's wall-clock budget (see docs/speedrun.md)
    seeds: int = 2  # seeds 0..seeds-1 of every recipe: same init and batch order across recipes
    tolerance: float = 0.03  # a run's loop time may miss the budget by this fraction before it is flagged
    probe_steps: int = 40  # the timing run's length (a multiple of 4: logs, an eval and a save inside)
    train_overrides: List[str] = field(default_factory=list)  # applied to every run, before the recipe's
    # Recipes that change only the optimizer: calibrated from the reference's probe, its step time × the
    # factor (1.0: lr, warmup, schedule; Muon's Newton–Schulz costs more), measured side by side in one
    # process (dev/bench/model.py --optim). This machine's speed drifts ±15 % between runs, so a
    # probe of their own gave the same work 206-250 steps.
    step_cost: Dict[str, float] = field(default_factory=dict)

    def __post_init__(self):
        self.recipes = {str(k): [str(o) for o in (v or [])] for k, v in (self.recipes or {}).items()}
        self.train_overrides = [str(o) for o in self.train_overrides or []]
        _require(self.recipes, "no recipes: list at least the reference, e.g. recipes: {baseline: []}")
        for name, overrides in self.recipes.items():
            _require(
                NAME.match(name),
                f"recipe name {name!r} must be letters, digits, '_' or '-' (it names a directory), e.g. muon_lr6e-3",
            )
            for o in [*overrides, *self.train_overrides]:
                key = o.split("=", 1)[0].lstrip("+~")
                _require("=" in o, f"{name}: {o!r} is not an override key=value")
                _require(
                    not any(key == r or (r.endswith(".") and key.startswith(r)) for r in RESERVED),
                    f"{name}: {key} is set by the speedrun (calibrated max_steps, seeds, run directories)",
                )
        _require(
            self.reference in self.recipes,
            f"reference {self.reference!r} is not among the recipes ({', '.join(self.recipes)})",
        )
        self.step_cost = {str(k): float(v) for k, v in (self.step_cost or {}).items()}
        unknown = [n for n in self.step_cost if n not in self.recipes]
        _require(not unknown, f"step_cost: {', '.join(unknown)} not among the recipes ({', '.join(self.recipes)})")
        _require(
            self.reference not in self.step_cost,
            f"step_cost: the reference {self.reference!r} calibrates the steps the others scale; leave it out",
        )
        bad = [f"{n}: {f}" for n, f in self.step_cost.items() if not f > 0]
        _require(not bad, f"step_cost: {', '.join(bad)} must be > 0 (the recipe's step time / the reference's)")
        _require(self.budget_s > 0, f"budget_s={self.budget_s} must be > 0 seconds")
        _require(self.seeds >= 1, f"seeds={self.seeds} must be >= 1")
        _require(0 < self.tolerance < 1, f"tolerance={self.tolerance} must be a fraction in (0, 1), e.g. 0.03")
        _require(
            self.probe_steps >= 8 and self.probe_steps % 4 == 0,
            f"probe_steps={self.probe_steps} must be a multiple of 4, at least 8 (e.g. 40)",
        )

    def to_dict(self) -> dict:
        return asdict(self)


def load_spec(path: Path, **changes) -> Spec:
    """The recipes file (lab/configs/speedrun/recipes.yaml), with command-line changes on top."""
    fields = read_spec_fields(path, Spec, SpeedrunError, "the recipes file")
    fields.update({k: v for k, v in changes.items() if v is not None})
    try:
        return Spec(**fields)
    except TypeError as e:
        raise SpeedrunError(f"{path}: {e}")


def _require(ok, message: str) -> None:
    if not ok:
        raise SpeedrunError(message)
