"""μP's learning-rate transfer experiment (docs/mup.md): SP and μP, AdamW and Muon, a width ladder × a ×2 lr
grid × seeds on one token budget, each run a train.py process (--jobs at a time); then
the table (results.md) and the figure (transfer.png) in --dir.

Usage: python -m lab.mup_transfer --dir DIR --dry-run   # the plan and its cost (a few seconds' timing)
       python -m lab.mup_transfer --dir DIR [--jobs 2]  # run; the same command again continues
       python -m lab.mup_transfer --dir DIR --report    # table and figure of what has finished
Grid options (--widths, --lrs, ...) only for a new DIR: a rerun takes the plan DIR was started with.
"""

import argparse
import functools
import math
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from analysis.runs import read_run, steady_tokens_per_s
from lab import SEARCH_PATH
from lab.launcher import COMPLETED, NOT_RUN, Ended, Launcher
from lab.mup.transfer import (
    DIVERGED,
    FINISHED,
    STOPPED,
    Cell,
    TransferError,
    TransferSpec,
    cost_table,
    open_experiment,
    read_results,
    run_cells,
    schedule,
    seconds_per_run,
)
from lab.mup.transfer_report import write_report
from training.budget import LoopCost
from training.checkpoint import RunFiles
from training.cli import compose_train_config, description, run
from training.loop import NonFiniteLoss

GRID = ("widths", "lrs", "seeds", "optimizers", "parametrizations")


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
    types = {"widths": int, "seeds": int, "lrs": float, "optimizers": str, "parametrizations": str}
    fields = {}
    for key in GRID:
        if getattr(args, key) is not None:
            try:
                fields[key] = tuple(types[key](v) for v in getattr(args, key).split(","))
            except ValueError:
                raise ValueError(f"--{key} {getattr(args, key)!r}: give comma-separated values") from None
    return TransferSpec(**fields, overrides=tuple(args.set))


def train_cells(
    pairs: list, spec: TransferSpec, threads: int, jobs: int = 1, keep_checkpoints: bool = False, extra: tuple = ()
):
    """(cell, what run_cells records) as each run of train.py ends, `jobs` processes at a time; its output
    in runs/<cell>.log. A run that fails other than by diverging is a TransferError naming its log."""
    cells = {run_dir: cell for cell, run_dir in pairs}
    with tempfile.TemporaryDirectory(prefix="mup-jobs-") as options:
        launcher = Launcher(
            Path(options),
            [f"experiment={spec.experiment}", *spec.overrides, f"trainer.num_threads={threads}", *extra],
            workers=jobs,
        )
        for ended in launcher.run([cell.job(run_dir, spec.min_lr_ratio) for cell, run_dir in pairs]):
            yield cells[ended.job.run_dir], outcome(ended, keep_checkpoints)


def outcome(ended: Ended, keep_checkpoints: bool) -> dict:
    """What run_cells records of one ended run."""
    if ended.status == NOT_RUN and ended.exit_code >= 128:  # a signal stopped it, or it never started
        return {"status": STOPPED}
    if ended.status != COMPLETED and NonFiniteLoss.__name__ not in ended.error_types:
        raise TransferError(
            f"{ended.job.run_dir.name} failed (exit {ended.exit_code}): "
            f"{ended.error or 'no error line'}; see {ended.job.log_path}"
        )
    run_dir = ended.job.run_dir
    if not keep_checkpoints:  # ~80 MB a run at width 512 with Adam's moments: a study reads only the metrics
        shutil.rmtree(RunFiles(run_dir).checkpoints, ignore_errors=True)
    evals = read_run(run_dir).evals if ended.status == COMPLETED else []
    loss = evals[-1]["val_loss"] if evals else float("nan")
    finite = math.isfinite(loss)
    row = {"status": FINISHED if finite else DIVERGED, "val_loss": loss if finite else None, "wall_s": ended.wall_s}
    along = schedule(evals)
    return {**row, "schedule": along} if along else row


def probe_seconds(spec: TransferSpec, threads: int, steps: int) -> dict:
    """{(optimizer, width): seconds per run}: a `steps`-step run of each (its start, eval and save included)
    plus the rest of max_steps at its measured throughput. Parametrization, lr and seed cost the same."""
    seconds = {}
    with tempfile.TemporaryDirectory() as tmp:
        for optimizer in spec.optimizers:
            for width in spec.widths:
                cell = Cell(optimizer, spec.parametrizations[0], width, min(spec.lrs), spec.seeds[0])
                cfg, _ = compose_train_config(
                    [SEARCH_PATH, f"experiment={spec.experiment}", *cell.overrides(spec.min_lr_ratio), *spec.overrides]
                )
                run_dir = Path(tmp) / cell.name
                ((_, probe),) = train_cells(
                    [(cell, run_dir)],
                    spec,
                    threads,
                    keep_checkpoints=True,
                    extra=(f"trainer.max_steps={steps}", f"trainer.log_interval={max(1, steps // 4)}"),
                )
                t = cfg.trainer
                rate = steady_tokens_per_s(read_run(run_dir).trains)  # the first interval warms up: left out
                step_s = t.micro_batch_size * t.seq_len * t.grad_accum_steps / rate
                # The probe's own wall time (start, eval, save included), then the steps after it.
                loop = LoopCost(step_s=step_s, eval_s=0.0, save_s=0.0, fixed_s=probe["wall_s"])
                seconds[(optimizer, width)] = loop.seconds(t.max_steps, t.eval_every, t.ckpt_interval, start=steps)
                print(f"  timing: {optimizer} width {width}: {seconds[(optimizer, width)]:.0f} s per run", flush=True)
    return seconds


def print_plan(spec: TransferSpec) -> None:
    cfg, _ = compose_train_config(
        [SEARCH_PATH, f"experiment={spec.experiment}", *spec.cells()[0].overrides(spec.min_lr_ratio), *spec.overrides]
    )
    t = cfg.trainer
    tokens = t.max_steps * t.micro_batch_size * t.seq_len * t.grad_accum_steps
    print(
        f"plan: {len(spec.cells())} runs = {len(spec.optimizers)} optimizers × {len(spec.parametrizations)} "
        f"parametrizations × {len(spec.widths)} widths × {len(spec.lrs)} lrs × {len(spec.seeds)} seeds"
    )
    print(
        f"  preset experiment={spec.experiment} {' '.join(spec.overrides)}; widths {list(spec.widths)} "
        f"({cfg.model.n_layers} layers, {cfg.model.n_heads} heads, μP base width {cfg.model.mup_base_width})"
    )
    lrs = ", ".join(f"{lr:.3g}" for lr in spec.lrs)
    print(f"  lrs {lrs}; min_lr = lr × {spec.min_lr_ratio}; seeds {list(spec.seeds)}")
    print(
        f"  each run: {t.max_steps} steps × {t.max_steps and tokens // t.max_steps:,} tokens = {tokens:,} tokens, "
        f"final validation loss on {t.eval_windows} windows"
    )


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
    print_plan(spec)
    if args.dry_run:
        measured, results = seconds_per_run(args.dir), read_results(args.dir)
        known = all((o, w) in measured for o in spec.optimizers for w in spec.widths)
        print(f"cost, per run from {'the runs finished here' if known else f'a {args.probe_steps}-step timing run'}:")
        seconds = measured if known else probe_seconds(spec, args.threads, args.probe_steps)
        print(cost_table(spec, [c for c in spec.cells() if c.name not in results], seconds, args.jobs))
        return 0
    runs = functools.partial(
        train_cells, spec=spec, threads=args.threads, jobs=args.jobs, keep_checkpoints=args.keep_checkpoints
    )
    status = run_cells(spec, args.dir, runs, one_at_a_time=args.jobs == 1)
    if read_results(args.dir):
        print("written: " + ", ".join(map(str, write_report(spec, args.dir))))
    return status


if __name__ == "__main__":
    run(main)
