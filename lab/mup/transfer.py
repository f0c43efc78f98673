"""The learning-rate transfer experiment (Tensor Programs V, Figure 1): for SP and μP, with AdamW and with
Muon, every width of a ladder trains at every lr of a ×2 grid with a few seeds, on one token budget. Each
finished run's final validation loss is appended to results.jsonl in the experiment directory, so a rerun
does only what is missing. How the runs train is the caller's (lab/mup_transfer.py: lab/launcher.py's
jobs); this module plans, schedules, records and prices."""

import dataclasses
import json
import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from lab.launcher import Job, move_aside
from training.log import read_metrics

SPEC_FILE, RESULTS_FILE = "spec.json", "results.jsonl"
FINISHED, DIVERGED, STOPPED = "finished", "diverged", "stopped"


class TransferError(ValueError):
    """A plan or directory that cannot run: one line naming the value or file."""


@dataclass(frozen=True)
class Cell:
    optimizer: str
    parametrization: str
    width: int
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.optimizer}_{self.parametrization}_w{self.width}_lr{self.lr:.6g}_s{self.seed}"

    def job(self, run_dir: Path, min_lr_ratio: float) -> Job:
        """The run as a launcher job: what overrides() says, as config values."""
        return Job(
            run_dir,
            {
                "model": {"parametrization": self.parametrization, "hidden_size": self.width},
                "optim": {"lr": self.lr, "min_lr": self.lr * min_lr_ratio},
                "seed": self.seed,
            },
            {"optim": self.optimizer},
        )

    def overrides(self, min_lr_ratio: float) -> List[str]:
        """What this run sets on top of the experiment preset (train.py's syntax)."""
        return [
            f"optim={self.optimizer}",
            f"model.parametrization={self.parametrization}",
            f"model.hidden_size={self.width}",
            f"optim.lr={self.lr!r}",
            f"optim.min_lr={self.lr * min_lr_ratio!r}",
            f"seed={self.seed}",
        ]


@dataclass(frozen=True)
class TransferSpec:
    widths: tuple = (64, 128, 256, 512)
    lrs: tuple = tuple(2.0**k for k in range(-9, -4))  # 0.00195 … 0.03125, ×2 apart
    seeds: tuple = (0, 1)
    optimizers: tuple = ("adamw", "muon")
    parametrizations: tuple = ("sp", "mup")
    min_lr_ratio: float = 0.1  # the cosine decays to lr × this, whatever the lr
    experiment: str = "mup_transfer"  # configs/experiment/<name>.yaml: the preset every run starts from
    overrides: tuple = ()  # more train.py overrides for every run (e.g. trainer.max_steps=...)

    def __post_init__(self):
        if len(self.widths) < 2 or min(self.widths) <= 0 or not self.lrs or min(self.lrs) <= 0 or not self.seeds:
            raise TransferError("the plan needs two or more positive widths, positive lrs and at least one seed")
        unknown = set(self.optimizers) - {"adamw", "muon"} | set(self.parametrizations) - {"sp", "mup"}
        if unknown:
            raise TransferError(f"unknown optimizer or parametrization {sorted(unknown)}; use adamw/muon, sp/mup")

    def cells(self, narrow_first: bool = False) -> List[Cell]:
        """Seed by seed, so the first seed's whole picture comes first; within a seed the widest first, so
        parallel jobs do not end on one long run — or, `narrow_first` (one run at a time), the cheap narrow runs
        first, so each wide run pairs with its narrow partner the moment it ends, and a session that stops
        mid-seed leaves no wide run unpaired."""
        return [
            Cell(o, p, w, lr, s)
            for s in self.seeds
            for w in sorted(self.widths, reverse=not narrow_first)
            for o in self.optimizers
            for p in self.parametrizations
            for lr in self.lrs
        ]

    def extends(self, other: "TransferSpec") -> bool:
        """The same runs' settings, with at least every grid point of `other`: its results stay valid."""
        same = all(getattr(self, k) == getattr(other, k) for k in ("min_lr_ratio", "experiment", "overrides"))
        return same and all(
            set(getattr(other, k)) <= set(getattr(self, k))
            for k in ("widths", "lrs", "seeds", "optimizers", "parametrizations")
        )

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, fields: dict) -> "TransferSpec":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def open_experiment(directory: Path, spec: Optional[TransferSpec], create: bool = True) -> TransferSpec:
    """The directory's plan: the one it was started with (spec.json), which `spec`, if given, must equal;
    a new directory records `spec` (or the default plan) unless not `create` (a dry run writes nothing)."""
    path = directory / SPEC_FILE
    if path.exists():
        try:
            stored = TransferSpec.from_dict(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError) as e:
            raise TransferError(f"{path} is unreadable ({e}); restore it or start a new --dir") from None
        if spec is None or spec == stored:
            return stored
        if not spec.extends(stored):
            raise TransferError(
                f"{directory} was started with another plan ({path}); rerun it without grid options, "
                "or with a grid that keeps every width, lr, seed, optimizer and parametrization "
                "of it (it may add some), or start a new --dir"
            )
        if create:  # a grown grid: the runs already done are kept, the new points are added
            path.write_text(json.dumps(spec.to_dict(), indent=1) + "\n")
        return spec
    spec = spec or TransferSpec()
    if create:
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(spec.to_dict(), indent=1) + "\n")
    return spec


def read_results(directory: Path) -> Dict[str, dict]:
    """{cell name: its row} of results.jsonl (a line cut off by a kill is dropped with a warning)."""
    path = directory / RESULTS_FILE
    return {row["cell"]: row for row in read_metrics(path)} if path.exists() else {}


def record(directory: Path, cell: Cell, outcome: dict) -> None:
    row = {"cell": cell.name, **dataclasses.asdict(cell), **outcome, "time": time.strftime("%Y-%m-%d %H:%M:%S")}
    with open(directory / RESULTS_FILE, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


# What a run's evaluations measured along its schedule (trainer.activation_rms, trainer.weight_change), kept in
# results.jsonl: the run directories stay on the machine that trained them; results.jsonl is what is published.
SCHEDULE_KEYS = {"rms_attn_logits": "attn_logits", "weight_change": "weight_change"}


def schedule(evals: List[dict]) -> Optional[dict]:
    """{"step": [...], "attn_logits": [[one per layer] per eval], "weight_change": [...]} from a run's eval rows,
    for the keys every row has; None when they have neither."""
    found = {
        name: [row[key] for row in evals]
        for key, name in SCHEDULE_KEYS.items()
        if evals and all(key in row for row in evals)
    }
    return {"step": [row["step"] for row in evals], **found} if found else None


def run_cells(
    spec: TransferSpec, directory: Path, train_cells: Callable, say=print, one_at_a_time: bool = False
) -> int:
    """Train every cell results.jsonl lacks; `train_cells([(cell, run_dir), …])` yields (cell, {"status":
    finished | diverged | stopped, "val_loss", "wall_s"}) as each run ends, and starts no run after the
    caller stops reading. A run directory left by a cut-off run is moved aside first (never deleted).
    `one_at_a_time`: the runs go one by one, so each seed's narrow runs go first (TransferSpec.cells).
    Returns 0 when all are done, 130 when a run was stopped (rerun to go on)."""
    done = read_results(directory)
    todo = [c for c in spec.cells(narrow_first=one_at_a_time) if c.name not in done]
    say(f"{len(done)} runs done, {len(todo)} to do")
    for cell in todo:
        if (directory / "runs" / cell.name).exists():
            move_aside(directory / "runs" / cell.name, directory / "discarded", cell.name)
    stopped = False
    for n, (cell, outcome) in enumerate(train_cells([(c, directory / "runs" / c.name) for c in todo]), 1):
        if outcome["status"] == STOPPED:  # a signal: the other jobs got it too; no new run starts
            stopped = True
            break
        record(directory, cell, outcome)
        loss = "diverged" if outcome["val_loss"] is None else f"val loss {outcome['val_loss']:.4f}"
        say(f"[{n}/{len(todo)}] {cell.name}: {loss} ({outcome['wall_s']:.0f} s)", flush=True)
    if stopped:
        say("stopped; the finished runs are recorded: continue with the same command")
    return 130 if stopped else 0


def seconds_per_run(directory: Path) -> Dict[tuple, float]:
    """{(optimizer, width): median wall seconds} of the runs already finished here."""
    walls: Dict[tuple, list] = {}
    for row in read_results(directory).values():
        walls.setdefault((row["optimizer"], row["width"]), []).append(row["wall_s"])
    return {key: statistics.median(values) for key, values in walls.items()}


def cost_table(spec: TransferSpec, todo: Sequence[Cell], seconds: Dict[tuple, float], jobs: int) -> str:
    """Runs to do and their time, per optimizer and width; the total divided over `jobs` processes."""
    lines = [f"{'optimizer':<10}{'width':>6}{'per run':>10}{'runs':>6}{'time':>11}"]
    total = 0.0
    for optimizer in spec.optimizers:
        for width in spec.widths:
            n = sum(c.optimizer == optimizer and c.width == width for c in todo)
            per_run = seconds.get((optimizer, width))
            total += (per_run or 0.0) * n
            time_text = "?" if per_run is None else f"{per_run * n / 60:.1f} min"
            lines.append(
                f"{optimizer:<10}{width:>6}{'?' if per_run is None else f'{per_run:.0f} s':>10}{n:>6}{time_text:>11}"
            )
    lines.append(f"total: {total / 60:.0f} min of runs, about {total / 60 / jobs:.0f} min with --jobs {jobs}")
    return "\n".join(lines)
