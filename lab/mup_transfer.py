"""μP's learning-rate transfer experiment (docs/mup.md): SP and μP × AdamW and Muon × a width ladder × a ×2 lr grid ×
seeds on one token budget, each run a train.py process through lab/sweep.py; then results.md and transfer.png.

Usage: python -m lab.mup_transfer --dir DIR --dry-run   # the plan and its cost (a few seconds' timing)
       python -m lab.mup_transfer --dir DIR [--jobs 2]  # run; the same command again continues
       python -m lab.mup_transfer --dir DIR --report    # table and figure of what has finished
Grid options (--widths, --lrs, ...) only for a new DIR or to grow its grid: a rerun takes the plan DIR was started with.
"""

import argparse
import dataclasses
import itertools
import json
import math
import shutil
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import matplotlib

from analysis.plots import figure, save
from lab import SEARCH_PATH, sweep
from lab.ablation.lr_search import choose_lr
from lab.launcher import NOT_RUN, Job, Launcher
from lab.sweep import DIVERGED, FINISHED
from training.checkpoint import RunFiles
from training.log import read_metrics
from training.program import compose_train_config, description, run

NAMES = {"sp": "SP", "mup": "μP", "adamw": "AdamW", "muon": "Muon"}
GRID = {"widths": int, "lrs": float, "seeds": int, "optimizers": str, "parametrizations": str}  # each option's type


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
        """The run as a launcher job: what it sets on top of the experiment preset."""
        model = {"parametrization": self.parametrization, "hidden_size": self.width}
        optim = {"lr": self.lr, "min_lr": self.lr * min_lr_ratio}
        return Job(run_dir, {"model": model, "optim": optim, "seed": self.seed}, {"optim": self.optimizer})


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
        """Seed by seed; within a seed the widest first (parallel jobs do not end on one long run), or narrow first
        (one at a time: each wide run pairs with its narrow partner the moment it ends)."""
        widths = sorted(self.widths, reverse=not narrow_first)
        order = itertools.product(self.seeds, widths, self.optimizers, self.parametrizations, self.lrs)
        return [Cell(o, p, w, lr, s) for s, w, o, p, lr in order]

    def extends(self, other: "TransferSpec") -> bool:
        """The same runs' settings, with at least every grid point of `other`: its results stay valid."""
        same = all(getattr(self, k) == getattr(other, k) for k in ("min_lr_ratio", "experiment", "overrides"))
        return same and all(set(getattr(other, k)) <= set(getattr(self, k)) for k in GRID)

    @classmethod
    def from_dict(cls, fields: dict) -> "TransferSpec":
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def open_experiment(directory: Path, spec: Optional[TransferSpec], create: bool = True) -> TransferSpec:
    """The directory's plan: the one it was started with (spec.json), which `spec`, if given, must equal or grow;
    a new directory records `spec` (or the default plan) unless not `create` (a dry run writes nothing)."""
    path = directory / "spec.json"
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
    spec = spec or TransferSpec()
    if create:  # a new directory, or a grown grid: the runs already done are kept, the new points are added
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(dataclasses.asdict(spec), indent=1) + "\n")
    return spec


def read_results(directory: Path) -> Dict[str, dict]:
    """{cell name: its row} of results.jsonl (a line cut off by a kill is dropped with a warning)."""
    path = directory / sweep.RESULTS
    return {row["cell"]: row for row in read_metrics(path)} if path.exists() else {}


def run_cells(
    spec: TransferSpec, directory: Path, launcher, keep_checkpoints=False, one_at_a_time=False, say=print
) -> int:
    """Train every cell results.jsonl lacks through lab/sweep.py; 0 when all are done, 130 when stopped (no run
    starts after that). `one_at_a_time`: each seed's narrow runs go first (TransferSpec.cells)."""
    done, root, results = read_results(directory), directory / "runs", directory / sweep.RESULTS
    todo = [c for c in spec.cells(narrow_first=one_at_a_time) if c.name not in done]
    say(f"{len(done)} runs done, {len(todo)} to do")
    cells = {root / c.name: c for c in todo}
    jobs = [c.job(root / c.name, spec.min_lr_ratio) for c in todo]
    for job in jobs:
        state = sweep.inspect(job.run_dir)
        if state.state in sweep.DONE:  # ended, yet never recorded (a kill between the two)
            sweep.append(results, sweep.row(job, state, root, None, outcome(cells[job.run_dir], state)))
    launched = sweep.launch(
        sweep.pending(jobs, root, directory / "discarded", say),
        launcher,
        root,
        results,
        lambda ended, state: outcome(cells[ended.job.run_dir], state),
    )
    for n, (ended, state) in enumerate(launched, 1):
        if ended.status == NOT_RUN and ended.exit_code >= 128:  # a signal: the other jobs got it too
            say("stopped; the finished runs are recorded: continue with the same command")
            return 130
        if state.state not in sweep.DONE:
            raise TransferError(
                f"{ended.job.run_dir.name} failed (exit {ended.exit_code}): "
                f"{ended.error or 'no error line'}; see {ended.job.log_path}"
            )
        if not keep_checkpoints:  # ~80 MB a run at width 512 with Adam's moments: a study reads only the metrics
            shutil.rmtree(RunFiles(ended.job.run_dir).checkpoints, ignore_errors=True)
        loss = outcome(cells[ended.job.run_dir], state)["val_loss"]
        loss = "diverged" if loss is None else f"val loss {loss:.4f}"
        say(f"[{n}/{len(jobs)}] {ended.job.run_dir.name}: {loss} ({ended.wall_s or 0:.0f} s)", flush=True)
    return 0


def outcome(cell: Cell, state: sweep.State) -> dict:
    """What results.jsonl records of a done run beside the driver's fields: its grid point, final val loss (None:
    diverged)."""
    evals = state.run.evals if state.run and state.state == FINISHED else []
    loss = evals[-1]["val_loss"] if evals else math.nan
    finite = math.isfinite(loss)
    row = {"cell": cell.name, **dataclasses.asdict(cell), "status": FINISHED if finite else DIVERGED}
    return {**row, "val_loss": loss if finite else None}


Losses = Dict[tuple, Dict[int, Dict[float, Optional[float]]]]  # [(optimizer, parametrization)][width][lr]


def mean_losses(spec: TransferSpec, results: Dict[str, dict]) -> Losses:
    """Mean final val loss over the seeds recorded so far; None when any seed diverged; a point with no
    seed recorded yet is left out."""
    losses: Losses = {}
    for o, p, w, lr in itertools.product(spec.optimizers, spec.parametrizations, spec.widths, spec.lrs):
        rows = [results[c.name] for c in (Cell(o, p, w, lr, s) for s in spec.seeds) if c.name in results]
        if rows:
            diverged = any(r["status"] == DIVERGED for r in rows)
            value = None if diverged else statistics.fmean(r["val_loss"] for r in rows)
            losses.setdefault((o, p), {}).setdefault(w, {})[lr] = value
    return losses


def best_lrs(losses: Losses) -> Dict[tuple, Dict[int, float]]:
    """Each width's lr with the lowest mean loss (the protocol's rule, choose_lr); widths where every lr diverged are
    left out."""
    best = {}
    for key, per_width in losses.items():
        for width, per_lr in per_width.items():
            lr = choose_lr(per_lr)
            if lr is not None:
                best.setdefault(key, {})[width] = lr
    return best


def drift(best: Dict[int, float]) -> float:
    """log2(best lr at the widest width / at the narrowest): 0 = transfers; -3 = moved 8× down."""
    return math.log2(best[max(best)] / best[min(best)])


def markdown(spec: TransferSpec, losses: Losses) -> str:
    best = best_lrs(losses)
    out = [
        f"# μP learning-rate transfer: final validation loss (nats/token), mean over seeds {list(spec.seeds)}",
        "",
        "Bold: each width's best lr. ×: diverged (any seed). Blank: not run yet.",
        "",
    ]
    for key in sorted(losses, key=lambda k: (k[0], k[1] != "sp")):  # SP, then μP, per optimizer
        at = best.get(key, {})
        moved = "best lr: too few widths finished"
        if len(at) > 1:
            moved = f"best lr moved 2^{drift(at):+.0f} from width {min(at)} to {max(at)}"
        edges = [w for w, lr in sorted(at.items()) if lr in (min(spec.lrs), max(spec.lrs))]
        if edges:  # the optimum may lie past the grid: the move shown is then a bound, not a measurement
            moved += f" (at the grid's edge at width {', '.join(map(str, edges))}: the optimum may lie beyond it)"
        out += [
            f"## {NAMES[key[0]]} · {NAMES[key[1]]}: {moved}",
            "",
            "| width | " + " | ".join(f"lr {lr:.3g}" for lr in spec.lrs) + " | best lr |",
            "|---:|" + "---:|" * (len(spec.lrs) + 1),
        ]
        for width, per_lr in sorted(losses[key].items()):
            cells = [_cell(per_lr, lr, at.get(width)) for lr in spec.lrs]
            best_lr = "" if at.get(width) is None else f"{at[width]:.3g}"
            out.append(f"| {width} | " + " | ".join(cells) + f" | {best_lr} |")
        out.append("")
    return "\n".join(out)


def _cell(per_lr: Dict[float, Optional[float]], lr: float, best: Optional[float]) -> str:
    if per_lr.get(lr) is None:
        return "×" if lr in per_lr else ""  # diverged, or not run yet
    return f"**{per_lr[lr]:.4f}**" if lr == best else f"{per_lr[lr]:.4f}"


def write_report(spec: TransferSpec, directory: Path) -> tuple:
    """results.md and transfer.png in the experiment directory, from whatever has finished."""
    losses = mean_losses(spec, read_results(directory))
    if not losses:
        raise ValueError(f"{directory} has no finished runs to report yet")
    table, figure = directory / "results.md", directory / "transfer.png"
    table.write_text(markdown(spec, losses))
    plot_transfer(losses, figure)
    return table, figure


def plot_transfer(losses: Losses, path: Path) -> None:
    """One row per optimizer, SP left and μP right: loss against lr, a line per width, a diverged point an × on the
    panel's top edge, each width's best lr a ring. Under μP the rings line up; under SP they drift as it widens."""
    optimizers = sorted({o for o, _ in losses})
    fig, axes = figure(len(optimizers), 2, figsize=(11, 4.2 * len(optimizers)), squeeze=False, sharey="row")
    for (row, optimizer), (col, parametrization) in itertools.product(enumerate(optimizers), enumerate(("sp", "mup"))):
        ax, per_width = axes[row][col], losses.get((optimizer, parametrization), {})
        finite = [v for per_lr in per_width.values() for v in per_lr.values() if v is not None]
        for i, (width, per_lr) in enumerate(sorted(per_width.items())):
            colour = matplotlib.colormaps["plasma"](i / max(len(per_width), 2))
            ok = sorted((lr, v) for lr, v in per_lr.items() if v is not None)
            if ok:
                ax.plot(*zip(*ok), marker="o", color=colour, label=f"width {width}")
                ax.scatter(*min(ok, key=lambda point: point[1]), s=150, facecolors="none", edgecolors=colour, lw=2)
            bad = [lr for lr, v in per_lr.items() if v is None]
            ax.scatter(bad, [max(finite, default=1.0)] * len(bad), marker="x", s=60, color=colour, clip_on=False)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="peak learning rate (optim.lr)", ylabel="final validation loss (nats/token)")
        ax.set_title(f"{NAMES[optimizer]} · {NAMES[parametrization]}")
        ax.grid(alpha=0.3)
        if per_width:  # a panel of a parametrization the plan left out stays empty
            ax.legend(fontsize=8)
    save(fig, path)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--dir", type=Path, help="the experiment directory (created, or continued)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its estimated time; train nothing")
    p.add_argument("--report", action="store_true", help="only write results.md and transfer.png")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time, each its own process (default 2: 2 cores)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per job")
    p.add_argument("--widths", help="comma-separated hidden sizes (default 64,128,256,512)")
    p.add_argument("--lrs", help="comma-separated peak lrs (default 2^-9 … 2^-5)")
    p.add_argument("--seeds", help="comma-separated seeds (default 0,1)")
    p.add_argument("--optimizers", help="comma-separated: adamw, muon (default both)")
    p.add_argument("--parametrizations", help="comma-separated: sp, mup (default both)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a train.py override for every run, e.g. --set trainer.max_steps=300 (new DIR only)",
    )
    p.add_argument("--probe-steps", type=int, default=20, help="steps of the dry run's timing run per width")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each finished run's final checkpoint")
    return p.parse_args(argv)


def spec_from_args(args) -> Optional[TransferSpec]:
    """The plan the options ask for; None when they ask for none (a rerun takes DIR's)."""
    if not args.set and all(getattr(args, key) is None for key in GRID):
        return None
    fields = {}
    for key in (k for k in GRID if getattr(args, k) is not None):
        try:
            fields[key] = tuple(GRID[key](v) for v in getattr(args, key).split(","))
        except ValueError:
            raise ValueError(f"--{key} {getattr(args, key)!r}: give comma-separated values") from None
    return TransferSpec(**fields, overrides=tuple(args.set))


def launcher(spec: TransferSpec, options_dir: Path, threads: int, jobs: int, extra=()) -> Launcher:
    """One train.py process per run, `jobs` at a time; its output in runs/<cell>.log."""
    overrides = [f"experiment={spec.experiment}", *spec.overrides, f"trainer.num_threads={threads}", *extra]
    return Launcher(options_dir, overrides, workers=jobs)


def timing_runs(spec: TransferSpec, tmp: Path, threads: int, steps: int) -> Optional[Dict[tuple, sweep.State]]:
    """{(optimizer, width): its `steps`-step timing run} in tmp (None for steps 0): parametrization, lr and seed cost
    the same."""
    if steps <= 0:
        return None
    cells = [
        Cell(o, spec.parametrizations[0], w, min(spec.lrs), spec.seeds[0]) for o in spec.optimizers for w in spec.widths
    ]
    keys = {tmp / c.name: (c.optimizer, c.width) for c in cells}
    jobs = [c.job(tmp / c.name, spec.min_lr_ratio) for c in cells]
    runs = launcher(spec, tmp, threads, 1, sweep.timing_overrides(steps))
    return {keys[ended.job.run_dir]: state for ended, state in sweep.launch(jobs, runs, tmp)}


def print_plan(spec: TransferSpec):
    """What the plan runs; returns the preset's config (every cell's budget is the same)."""
    cfg, _ = compose_train_config([SEARCH_PATH, f"experiment={spec.experiment}", *spec.overrides])
    t = cfg.trainer
    tokens = t.max_steps * t.micro_batch_size * t.seq_len * t.grad_accum_steps
    lines = [
        f"plan: {len(spec.cells())} runs = {len(spec.optimizers)} optimizers × {len(spec.parametrizations)} "
        f"parametrizations × {len(spec.widths)} widths × {len(spec.lrs)} lrs × {len(spec.seeds)} seeds",
        f"  preset experiment={spec.experiment} {' '.join(spec.overrides)}; widths {list(spec.widths)} "
        f"({cfg.model.n_layers} layers, {cfg.model.n_heads} heads, μP base width {cfg.model.mup_base_width})",
        f"  lrs {', '.join(f'{lr:.3g}' for lr in spec.lrs)}; min_lr = lr × {spec.min_lr_ratio}; seeds {list(spec.seeds)}",
        f"  each run: {t.max_steps} steps × {t.max_steps and tokens // t.max_steps:,} tokens = {tokens:,} tokens, "
        f"final validation loss on {t.eval_windows} windows",
    ]
    print("\n".join(lines))
    return cfg


def print_cost(spec: TransferSpec, budget: sweep.Budget, directory: Path, args) -> None:
    """Runs to do and their time per optimizer and width (lab/sweep.py's estimate)."""
    results, finished = read_results(directory), {}
    for row in results.values():
        state = sweep.inspect(directory / "runs" / row["cell"])
        if state.state == FINISHED:
            finished.setdefault((row["optimizer"], row["width"]), []).append(state.run)
    budgets = {(o, w): budget for o in spec.optimizers for w in spec.widths}
    with tempfile.TemporaryDirectory() as tmp:
        seconds, source = sweep.estimate(
            budgets,
            finished,
            lambda: timing_runs(spec, Path(tmp), args.threads, args.probe_steps),
            "optimizer and width",
        )
    print(f"cost, per run from {source}:")
    todo, total = [c for c in spec.cells() if c.name not in results], 0.0
    for (optimizer, width), per_run in sorted(seconds.items()):
        n = sum(c.optimizer == optimizer and c.width == width for c in todo)
        total += (per_run or 0.0) * n
        cost = "?" if per_run is None else f"{per_run:.0f} s per run × {n} runs = {per_run * n / 60:.1f} min"
        print(f"  {optimizer} width {width}: {cost}")
    print(f"total: {total / 60:.0f} min of runs, about {total / 60 / args.jobs:.0f} min with --jobs {args.jobs}")


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dir is None:
        raise ValueError("--dir DIR is needed")
    if args.jobs < 1 or args.threads < 1:
        raise ValueError("--jobs and --threads must be >= 1")
    spec = open_experiment(args.dir, spec_from_args(args), create=not (args.dry_run or args.report))
    if args.report:
        print("written: " + ", ".join(map(str, write_report(spec, args.dir))))
        return 0
    cfg = print_plan(spec)
    if args.dry_run:
        print_cost(spec, sweep.Budget.of(cfg), args.dir, args)
        return 0
    with tempfile.TemporaryDirectory(prefix="mup-jobs-") as options:
        runs = launcher(spec, Path(options), args.threads, args.jobs)
        status = run_cells(spec, args.dir, runs, args.keep_checkpoints, one_at_a_time=args.jobs == 1)
    if read_results(args.dir):
        print("written: " + ", ".join(map(str, write_report(spec, args.dir))))
    return status


if __name__ == "__main__":
    run(main)
