"""The lab's one sweep driver, for the ablation protocol and the μP transfer sweep: jobs → launch (skip done, resume
cut-off, move failed aside) → one results.jsonl row per ended run; and its cost (seconds per run, one estimate)."""

import hashlib
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Dict, Hashable, Iterator, List, Optional, Sequence, Tuple

from analysis.runs import Run, RunsError, read_run, steady_tokens_per_s
from lab.launcher import Ended, Job, Launcher, read_job_status
from training.budget import LoopCost, event_counts
from training.checkpoint import RunFiles

FINISHED, DIVERGED, FAILED = "finished", "diverged", "failed"  # a job that ended
RESUMABLE, RESTART, MISSING = "resumable", "restart", "missing"  # cut off with, or without, a checkpoint
DONE = (FINISHED, DIVERGED)  # never run again: a diverged run would diverge again (same seed, same data)
RESULTS = "results.jsonl"


@dataclass
class State:
    """Where a run directory stands; `run` is read whenever its metrics exist, `error` is the job's one line."""

    path: Path
    state: str
    run: Optional[Run] = None
    error: str = ""

    @property
    def final_bpb(self) -> Optional[float]:
        """Final val bpb of a finished run; None for anything else (diverged included)."""
        if self.state != FINISHED:
            return None
        value = self.run.final.get("val_bpb")
        return value if value is not None and math.isfinite(value) else None


def inspect(path: Path) -> State:
    """The run directory's state, from job_status.yaml (lab/launcher.py writes it), its metrics and checkpoints."""
    status = read_job_status(path) or {}
    run = _read_run(path)
    if status.get("status") == "FAILED":
        return State(path, DIVERGED if is_divergence(status) else FAILED, run, status.get("error", ""))
    if run is not None and run.complete:
        return State(path, FINISHED, run)
    ckpts = RunFiles(path).checkpoints
    if ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir()):
        return State(path, RESUMABLE, run)
    return State(path, RESTART if path.exists() else MISSING, run)


def is_divergence(status: dict) -> bool:
    """A training-time non-finite loss or gradient (train.py's NonFiniteLoss), not a crash or a bad config."""
    return "NonFiniteLoss" in status.get("error_types", []) or "non-finite" in status.get("error", "").lower()


def _read_run(path: Path) -> Optional[Run]:
    if not (RunFiles(path).config.is_file() and RunFiles(path).metrics.is_file()):  # the two files every study reads
        return None
    try:
        return read_run(path)
    except RunsError:  # cut off mid-write by a kill: the run restarts or resumes from its checkpoint
        return None


def file_digests(path: Path) -> Dict[str, str]:
    """{file: SHA-256, 16 hex} of every file in a run directory but its checkpoints: what its results derive from."""
    checkpoints = RunFiles(path).checkpoints
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(path.rglob("*"))
        if p.is_file() and checkpoints not in p.parents
    }


def move_aside(path: Path, discarded_dir: Path, name) -> Path:
    """Keep a failed or cut-off run out of the way (never delete it) before it runs again:
    discarded_dir/<time>/<name>, with -1, -2, … when that exists already."""
    target = discarded_dir / time.strftime("%Y-%m-%d_%H-%M-%S") / name
    n = 1
    while target.exists():
        target = target.with_name(f"{target.name}-{n}")
        n += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), str(target))
    return target


def pending(jobs: Sequence[Job], root: Path, discarded: Path, say=print) -> List[Job]:
    """The jobs to launch: a done run is skipped, a resumable one continues (resume=its directory), a failed or
    checkpoint-less one is moved to discarded/<time>/<its directory under root> first."""
    todo = []
    for job in jobs:
        s = inspect(job.run_dir)
        if s.state in DONE:
            continue
        name = job.run_dir.relative_to(root).as_posix()
        if s.state in (FAILED, RESTART):
            moved = move_aside(job.run_dir, discarded, name)
            say(f"{name} {s.state}{': ' + s.error if s.error else ''}; moved to {moved}, running it again")
        elif s.state == RESUMABLE:
            job = replace(job, values={**job.values, "resume": str(job.run_dir)})
        todo.append(job)
    return todo


def launch(
    jobs: Sequence[Job], launcher: Launcher, root: Path, results: Optional[Path] = None, extra: Callable = None
) -> Iterator[Tuple[Ended, State]]:
    """(how each job ended, its run's state) as each ends; a done one appends its row() to `results`, with
    `extra(ended, state)`'s fields (e.g. its grid point)."""
    for ended in launcher.run(jobs, root=root):
        state = inspect(ended.job.run_dir)
        if results is not None and state.state in DONE:
            append(results, row(ended.job, state, root, ended.wall_s, extra(ended, state) if extra else {}))
        yield ended, state


def row(job: Job, state: State, root: Path, wall_s: Optional[float], extra: dict) -> dict:
    """A done run's results.jsonl row: `extra`, its overrides, run directory, final bpb, tokens/s and wall time."""
    return {
        **extra,
        "overrides": {**job.choices, **job.values},
        "run_dir": job.run_dir.relative_to(root).as_posix(),
        "val_bpb": state.final_bpb,
        "tokens_per_s": steady_tokens_per_s(state.run.trains) if state.run else None,
        "wall_s": wall_s,
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }


def append(path: Path, row: dict) -> None:
    """One line, flushed to disk: a kill leaves at most a cut-off last line (read_metrics drops it)."""
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())


# Per job in a multirun: building the model, the final checkpoint, Python-side setup. Measured on the
# 2-core CPU (≈2–3 s); a GPU job adds compilation, which the timing run then also shows.
JOB_OVERHEAD_S = 3.0
UNKNOWN_EVAL_WINDOWS = 256  # trainer.eval_windows=all: the split's size is only known once data is prepared
EVAL_COST = 1 / 3  # an eval token is a forward pass: about a third of a training token's FLOPs


@dataclass
class Budget:
    """One run's workload, from its composed config."""

    max_steps: int
    tokens_per_step: int
    eval_interval: int
    eval_tokens: int  # tokens scored per eval (windows × seq_len)

    @classmethod
    def of(cls, cfg) -> "Budget":
        t = cfg.trainer
        windows = t.num_eval_windows or UNKNOWN_EVAL_WINDOWS
        return cls(
            t.max_steps,
            t.micro_batch_size * t.seq_len * t.grad_accum_steps,
            t.eval_every(t.max_steps),
            windows * t.seq_len,
        )

    @property
    def evals(self) -> int:
        return event_counts(self.max_steps, self.eval_interval, self.max_steps)[0]


def eval_seconds(run: Run) -> Optional[float]:
    """Median wall seconds of the run's evals: an eval row's time less that of the train row logged
    just before it at the same step. None when no eval follows a train row."""
    logged = {r["step"]: r["time"] for r in run.trains if "time" in r}
    spans = [e["time"] - logged[e["step"]] for e in run.evals if "time" in e and e["step"] in logged]
    return statistics.median(spans) if spans else None


def run_seconds(budget: Budget, runs: Sequence[Run]) -> Optional[float]:
    """Seconds one run of `budget` takes at the median throughput of `runs` (any length), its evals at
    the runs' measured eval time (the FLOP estimate where none was measured)."""
    rates = [r for r in (steady_tokens_per_s(run.trains) for run in runs) if r]
    if not rates:
        return None
    measured = [e for e in map(eval_seconds, runs) if e is not None]
    return seconds_at(budget, statistics.median(rates), statistics.median(measured) if measured else None)


def timing_overrides(steps: int) -> List[str]:
    """A timing run: `steps` steps ending in its one eval and checkpoint, five log intervals (the first is warm-up)."""
    return [
        f"trainer.max_steps={steps}",
        f"trainer.eval_interval={steps}",
        f"trainer.ckpt_interval={steps}",
        f"trainer.log_interval={max(1, steps // 5)}",
        "logger.wandb=disabled",
    ]


def estimate(
    budgets: Dict[Hashable, Budget],
    finished: Dict[Hashable, List[Run]],
    timing: Callable[[], Optional[Dict[Hashable, State]]],
    each: str,
    stored: Dict[Hashable, float] = None,
    stored_source: str = "",
) -> Tuple[Dict[Hashable, Optional[float]], str]:
    """({key: seconds one run of its budget takes, or None}, where from), for every study: the runs finished here
    where every key has some; else the timing runs timing() gives (None: none; at the smallest LR, as throughput does
    not depend on it and it is the least likely to diverge); else `stored` tokens/s covering every key; else nothing.
    A ValueError names a timing run that did not finish."""
    if all(finished.get(key) for key in budgets):
        return {key: run_seconds(budgets[key], finished[key]) for key in budgets}, "the runs finished here"
    states = timing()
    if states:
        for s in states.values():
            if s.state != FINISHED:
                raise ValueError(
                    f"the timing run {s.path} did not finish ({s.state}{': ' + s.error if s.error else ''})"
                )
        seconds = {key: run_seconds(budgets[key], [s.run]) for key, s in states.items()}
        return seconds, f"a {next(iter(states.values())).run.max_steps}-step timing run of each {each}"
    if stored and set(budgets) <= set(stored):
        return {key: seconds_at(budgets[key], stored[key]) for key in budgets}, stored_source
    return dict.fromkeys(budgets), f"nothing yet (no timing run: --probe-steps N times each {each} first)"


def seconds_at(budget: Budget, tps: float, per_eval: Optional[float] = None) -> float:
    """Seconds one run of `budget` takes at `tps` training tokens/s; each eval `per_eval` seconds, or its
    FLOP estimate at that throughput; checkpoints of these small models are not counted."""
    per_eval = budget.eval_tokens * EVAL_COST / tps if per_eval is None else per_eval
    loop = LoopCost(step_s=budget.tokens_per_step / tps, eval_s=per_eval, save_s=0.0, fixed_s=JOB_OVERHEAD_S)
    return loop.seconds(budget.max_steps, budget.eval_interval, ckpt_interval=budget.max_steps)
