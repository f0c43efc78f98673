"""RunState: where a run stands — step, tokens, training time, skipped steps, the best validation so far —
and state.json, the checkpoint file that carries it into a resume. This module alone writes and reads
state.json (a checkpoint's last file: list_checkpoints takes a directory holding it as complete)."""
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from training.runtime.run_files import STATE

# A time budget's end before its first plan (training/budget.py): the schedule runs towards an end this far away,
# so past the warmup the learning rate stays at its peak and nothing trained before the plan depends on an end
# nobody knew yet.
UNPLANNED_END = 10 ** 9


def clock() -> float:
    """Wall seconds: the one clock a run's training time and its time budget are read from (a test drives it by
    steps instead: tests/fault_injection.py's step_clock)."""
    return time.time()


@dataclass
class RunState:
    step: int = 0  # optimizer steps done
    tokens_seen: int = 0
    elapsed_before: float = 0.0  # training seconds of the processes this run resumes
    skipped_steps: int = 0  # non-finite steps whose update was skipped, over the whole run
    best_val_bpb: float = math.inf
    best_step: Optional[int] = None
    seed: int = 0  # with `step`, where the data order continues (data/loader.py draws batch n from it)
    sampling: str = "random"  # data.sampling: which order that is; a resume must keep it
    world_size: int = 1
    max_steps: int = 0  # where the schedule ends: trainer.max_steps, or what a time budget decided
    stop_at: Optional[int] = None  # trainer.stop_at_step: stop early there, as if interrupted
    budget_minutes: Optional[float] = None  # the time budget that plans max_steps (training/budget.py)
    # each of its plans: at_step, max_steps, step_s, spent_s; the first, at step 0, is trainer.max_epochs' or
    # max_steps' end when one is set (its "limit" names it): the clock's plans never go past it
    plans: list = field(default_factory=list)
    evals_since_best: int = 0  # evaluations in a row that did not lower best_val_bpb (trainer.early_stopping)
    stopped_early: bool = False
    precision: str = ""  # bf16 | fp32: what this process trains in; state.json carries it to a resume
    started: float = field(default_factory=clock)  # this process's training clock

    @property
    def end(self) -> int:
        """The step this process stops at."""
        return min(self.max_steps, self.stop_at or self.max_steps)

    @property
    def schedule_ends(self) -> list:
        """What the learning-rate schedule follows (training/optim/schedule.py): [] without a time budget (it runs
        to max_steps); with one, the far end it runs towards before the first plan, then each plan's end."""
        if not self.plans and self.max_steps != UNPLANNED_END:
            return []
        return [(0, UNPLANNED_END)] + [(plan["at_step"], plan["max_steps"]) for plan in self.plans]

    @property
    def budget_decided(self) -> bool:
        return self.budget_minutes is not None

    def plan_budget(self, minutes: float, max_steps: int, step_s: float, spent_s: float, next_at: int,
                    limit: str = "") -> None:
        """A time budget's plan at this step: the run now ends at max_steps, and plans again at next_at. `limit`:
        the setting that decided it when not the clock (trainer.max_epochs or max_steps, before the probe)."""
        self.budget_minutes, self.max_steps = minutes, max_steps
        self.plans.append({"at_step": self.step, "max_steps": max_steps, "next_at": next_at,
                           "step_s": round(step_s, 6), "spent_s": round(spent_s, 3), **({"limit": limit} if limit else {})})

    def advance(self, tokens: int) -> None:
        self.step += 1
        self.tokens_seen += tokens

    def elapsed_s(self) -> float:
        """Training seconds over the whole run: earlier processes', then this one's."""
        return self.elapsed_before + clock() - self.started

    def improves_best(self, val_bpb: float) -> bool:
        """Record `val_bpb` at this step if it is the lowest so far; whether it was."""
        if not (math.isfinite(val_bpb) and val_bpb < self.best_val_bpb):
            self.evals_since_best += 1
            return False
        self.best_val_bpb, self.best_step, self.evals_since_best = val_bpb, self.step, 0
        return True

    def stop_early(self) -> None:
        """End the run at this step (it is saved as its last checkpoint)."""
        self.stopped_early, self.stop_at = True, self.step

    def to_json(self) -> dict:
        """state.json's fields (the writer adds weights_finite: it refuses non-finite weights)."""
        return {"step": self.step, "tokens_seen": self.tokens_seen, "elapsed_s": self.elapsed_s(),
                "max_steps": self.max_steps,  # where the schedule was heading: a resume says if that moves
                # sampling only when not random: a checkpoint without it (every older one) drew at random.
                "data_position": {"seed": self.seed, "next_step": self.step,
                                  **({"sampling": self.sampling} if self.sampling != "random" else {})},
                "world_size": self.world_size,
                "skipped_steps": self.skipped_steps,
                "best_val_bpb": self.best_val_bpb if math.isfinite(self.best_val_bpb) else None,
                "best_step": self.best_step, "evals_since_best": self.evals_since_best,
                **({"precision": self.precision} if self.precision else {}),
                **({"stopped_early": True} if self.stopped_early else {}),
                **({"budget": {"minutes": self.budget_minutes, "max_steps": self.max_steps, "plans": self.plans}}
                   if self.budget_decided else {})}

    @classmethod
    def from_json(cls, fields: dict) -> "RunState":
        """A resumed run's state (fields added later default, so older checkpoints load). A time budget's
        budget's plans come back with it: the resumed run's schedule is the one its plans made. (A budget
        saved before plans were recorded was one plan, made inside the warmup.)"""
        budget = fields.get("budget") or {}
        plans = budget.get("plans") or ([{"at_step": 0, "max_steps": budget["max_steps"]}] if budget else [])
        return cls(step=fields["step"], tokens_seen=fields["tokens_seen"], elapsed_before=fields["elapsed_s"],
                   skipped_steps=fields.get("skipped_steps", 0), best_val_bpb=fields.get("best_val_bpb") or math.inf,
                   best_step=fields.get("best_step"), evals_since_best=fields.get("evals_since_best", 0),
                   stopped_early=fields.get("stopped_early", False), precision=fields.get("precision", ""),
                   seed=fields.get("data_position", {}).get("seed", 0),
                   sampling=fields.get("data_position", {}).get("sampling", "random"),
                   world_size=fields.get("world_size", 1), max_steps=budget.get("max_steps", 0),
                   budget_minutes=budget.get("minutes"), plans=plans)


def write_state(path: Path, fields: dict) -> None:
    """state.json, two-space indented (one field per line for `cat`). Only finite weights are ever saved, and
    manifest.json is written after it: "manifest" tells a loader a missing one was deleted (checkpoint/manifest.py)."""
    Path(path).write_text(json.dumps({**fields, "weights_finite": True, "manifest": True}, indent=2))


def read_state(ckpt: Path) -> dict:
    """A checkpoint's state.json fields. Raises OSError / ValueError for a missing or unreadable file."""
    return json.loads((Path(ckpt) / STATE).read_text())
