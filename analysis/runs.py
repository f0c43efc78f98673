"""Finding run directories, reading their config.yaml and metrics.jsonl, and grouping seeds into variants."""

import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

from training.checkpoint import METRICS, RunFiles, read_state, run_checkpoints
from training.log import MetricsError, read_metrics

# Keys that differ between runs without changing what is trained or measured: never part of a
# variant's name (seed is the repeat; a trailing dot means the whole section).
NOT_A_VARIANT = (
    "seed",
    "run_name",
    "outputs_dir",
    "resume",
    "data.cache_dir",
    "trainer.device",
    "trainer.num_threads",
    "trainer.stop_at_step",
    "trainer.ckpt_interval",
    "trainer.keep_last",
    "trainer.log_interval",
    "trainer.eval_interval",
    "trainer.activation_rms",
    "trainer.sample_tokens",
    "trainer.sample_prompt",
    "trainer.dist_timeout_s",
    "trainer.peak_tflops",
    "logger.",
)


class RunsError(ValueError):
    """Bad input: the message is one line that names the directory or file at fault."""


@dataclass
class Run:
    path: Path
    config: dict  # the resolved config.yaml train.py wrote
    evals: List[dict]  # eval rows of metrics.jsonl, in step order
    trains: List[dict]
    # the newest checkpoint's state.json: its max_steps, or its step if it stopped early
    planned_end: Optional[int] = None

    @property
    def seed(self) -> int:
        return self.config.get("seed", 0)

    @property
    def max_steps(self) -> Optional[int]:
        """Where the run was heading: its newest checkpoint's end (what a time budget planned, what max_epochs
        made of the data, or where early stopping ended it), else trainer.max_steps."""
        return self.planned_end or self.config["trainer"]["max_steps"]

    @property
    def complete(self) -> bool:
        """Reached its last step and evaluated there (a diverged or stopped run did not)."""
        return bool(self.evals) and self.max_steps is not None and self.evals[-1]["step"] >= self.max_steps

    @property
    def final(self) -> dict:
        return self.evals[-1]

    @property
    def precisions(self) -> List[str]:
        """What it trained in (bf16 | fp32), in order: two if a resume on another machine changed it, none if
        its metrics predate the train rows recording it."""
        return list(dict.fromkeys(r["precision"] for r in self.trains if "precision" in r))

    def eval_seconds(self) -> List[tuple]:
        """(seconds into the training loop, val bpb) of each evaluation: when its row was written, from the loop's
        start (a train row's wall-clock stamp less its elapsed_s), so compilation and evaluations count, as a
        user waiting for the loss sees them. Empty for runs whose rows lack the stamps."""
        timed = [r for r in self.trains if "time" in r and "elapsed_s" in r]
        if not timed:
            return []
        start = timed[0]["time"] - timed[0]["elapsed_s"]
        return [(e["time"] - start, e["val_bpb"]) for e in self.evals if "time" in e and "val_bpb" in e]

    def wall_time_s(self) -> float:
        """Training wall time including evals and checkpoints (not interpreter start-up or data prep)."""
        return max((r.get("elapsed_s", 0.0) for r in self.trains), default=float("nan"))


@dataclass
class Variant:
    label: str
    runs: List[Run] = field(default_factory=list)  # the seeds

    @property
    def config(self) -> dict:
        return self.runs[0].config


def find_run_dirs(paths: Sequence[Path]) -> List[Path]:
    """Each path is a run directory (holds metrics.jsonl) or is searched recursively for them."""
    found = []
    for path in map(Path, paths):
        if not path.is_dir():
            raise RunsError(f"{path} is not a directory")
        if RunFiles(path).metrics.is_file():
            found.append(path)
        else:
            found.extend(sorted(p.parent for p in path.rglob(METRICS)))
    if not found:
        raise RunsError(f"no run directories (with a metrics.jsonl) under {' '.join(map(str, paths))}")
    return list(dict.fromkeys(found))  # an input given twice counts once


def read_run(path: Path) -> Run:
    try:
        config = RunFiles(path).read_config()
    except (OSError, yaml.YAMLError) as e:
        raise RunsError(f"{path}: cannot read config.yaml ({type(e).__name__}: {str(e).splitlines()[0]})")
    if not isinstance(config, dict) or not {"model", "trainer"} <= config.keys():
        raise RunsError(f"{path}/config.yaml is not a minillama run config (no model/trainer section)")
    try:  # a run killed mid-write has a cut-off last line: dropped with a warning, as resume does
        rows = read_metrics(RunFiles(path).metrics)
    except MetricsError as e:
        raise RunsError(str(e))
    by_step = lambda kind: sorted((r for r in rows if r.get("kind") == kind), key=lambda r: r["step"])
    return Run(path, config, by_step("eval"), by_step("train"), planned_end(path))


def planned_end(path: Path) -> Optional[int]:
    """The step the run ends at by its newest checkpoint's state.json (None without a readable one): trainer.max_steps
    is only the schedule's length when neither a time budget nor max_epochs nor early stopping decided it."""
    checkpoints = run_checkpoints(RunFiles(path).checkpoints)
    if not checkpoints:
        return None
    try:
        state = read_state(checkpoints[-1])
    except (OSError, ValueError):
        return None
    return state["step"] if state.get("stopped_early") else state.get("max_steps")


def read_complete_runs(paths: Sequence[Path], warn=lambda m: print(m, file=sys.stderr)) -> tuple:
    """(complete runs, skipped runs). Incomplete runs (diverged, stopped, still running) are skipped
    with a warning, so one bad cell does not hide the others; none complete is an error."""
    runs = [read_run(p) for p in find_run_dirs(paths)]
    skipped = [r for r in runs if not r.complete]
    for r in skipped:
        last = r.evals[-1]["step"] if r.evals else "no eval"
        end = r.max_steps if r.max_steps is not None else "an end only its deleted checkpoints recorded"
        warn(f"warning: skipping {r.path}: incomplete (last eval at step {last} of {end})")
    complete = [r for r in runs if r.complete]
    if not complete:
        raise RunsError(f"none of the {len(runs)} runs found reached its last eval (trainer.max_steps)")
    return complete, skipped


def flatten(config: dict, prefix: str = "") -> Dict[str, object]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = tuple(value) if isinstance(value, list) else value
    return out


def varying_keys(runs: Sequence[Run]) -> List[str]:
    """Config keys whose values differ between runs, except those in NOT_A_VARIANT (seed etc.)."""
    flat = [flatten(r.config) for r in runs]
    keys = sorted(set().union(*flat))
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
    return [k for k in differ if not any(k == n or (n.endswith(".") and k.startswith(n)) for n in NOT_A_VARIANT)]


def group_variants(runs: Sequence[Run], warn=lambda m: print(m, file=sys.stderr)) -> List[Variant]:
    """Runs that differ only in seed (and NOT_A_VARIANT keys) form one variant, labelled
    'norm + mlp' plus any other differing key=value."""
    extra = [k for k in varying_keys(runs) if k not in ("model.norm", "model.mlp")]
    variants: Dict[str, Variant] = {}
    for run in runs:
        flat = flatten(run.config)
        label = " + ".join([str(flat.get("model.norm")), str(flat.get("model.mlp"))])
        label = ", ".join([label] + [f"{k}={_short(flat.get(k))}" for k in extra])
        variants.setdefault(label, Variant(label)).runs.append(run)
    for v in variants.values():
        seeds = [r.seed for r in v.runs]
        if len(set(seeds)) < len(seeds):
            warn(f"warning: {v.label}: seed repeated ({sorted(seeds)}); repeats of one seed are not independent")
    return [variants[k] for k in sorted(variants)]


def _short(value) -> str:
    """A config value for a label: floats without binary noise (3e-3 / 10 → 0.0003)."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def steady_tokens_per_s(rows: Sequence[dict]) -> Optional[float]:
    """A run's training throughput: the median over its logged intervals (metrics.jsonl's train rows), the first
    (allocator, thread-pool and compile warm-up) left out when at least two others remain; None when none is timed."""
    rates = [r["tokens_per_s"] for r in rows if r.get("kind", "train") == "train" and r.get("tokens_per_s")]
    rates = rates[1:] if len(rates) > 2 else rates
    return statistics.median(rates) if rates else None
