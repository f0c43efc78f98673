"""The speedrun: each recipe trained for the same wall-clock budget on seeds 0..N-1, scored on the
whole validation split, and judged against the reference with paired seed statistics.

    python -m lab.speedrun_campaign --lock /tmp/minillama-cpu.lock                # every recipe, 2 seeds, 10 min each
    python -m lab.speedrun_campaign --only baseline,muon --seeds 3                 # a subset, more seeds
    python -m lab.speedrun_campaign --dry-run                                      # the plan and its cost only
    python -m lab.speedrun_campaign --report-only                                  # the report from what finished
    python -m lab.speedrun_campaign --only baseline,muon --seeds 3 --sequential    # more seeds after a look (α / looks)

Per recipe (lab/configs/speedrun/recipes.yaml: train.py overrides on top of the defaults) a short probe
run measures the step, eval and checkpoint times and the compile time; trainer.max_steps is set so
that the training loop takes the budget (the same steps for every seed, so seeds stay paired). The
budget is train.py's loop: from the first step to the final checkpoint, compile, evals and checkpoints
included; interpreter start-up, data preparation and the final full-split evaluation are not (see
docs/speedrun.md). Every run uses logger=none (wandb's background process would take CPU time).
Resumable: finished runs are kept, a run cut off midway is moved to <dir>/discarded/ and redone.
Trailing key=value arguments go to every run (e.g. data.cache_dir=…). Exit status: 0 done, 1 an error.
Every report is a look (<dir>/looks.json): seeds beyond a look's are refused unless --sequential, which
judges every later look at α / looks (no optional stopping).
"""

import argparse
import os
import platform
import subprocess
import sys
from pathlib import Path

from lab import CONFIGS, SEARCH_PATH
from lab.looks import check_added_seeds
from lab.speedrun.campaign import Campaign, calibrate, check_step_cost, cost, measure
from lab.speedrun.report import report
from lab.speedrun.spec import SpeedrunError, load_spec
from training.cli import REPO, compose_run_config, description, one_line, run

DEFAULT_RECIPES = CONFIGS / "speedrun" / "recipes.yaml"
STOPPED = "stopped: rerun the same command to continue (finished runs are kept)"  # after a Ctrl-C


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="train.py overrides for every run")
    p.add_argument("--recipes", type=Path, default=DEFAULT_RECIPES, help="the recipes file")
    p.add_argument("--dir", type=Path, default=Path("runs/speedrun"), help="where runs live (resumed if it exists)")
    p.add_argument("--only", help="comma-separated recipes to run (the report covers every recipe with results)")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 per recipe (default: the file's)")
    p.add_argument("--budget", type=float, help="seconds of training loop per run (default: the file's)")
    p.add_argument("--tolerance", type=float, help="allowed miss of the budget, a fraction (default: the file's)")
    p.add_argument("--probe-steps", type=int, help="steps of the timing run (default: the file's)")
    p.add_argument("--reference", help="the recipe every other one is judged against")
    p.add_argument(
        "--lock",
        type=Path,
        help="hold an flock on this file during each run, probe and evaluation, "
        "so other jobs sharing the machine never run at the same time (their timing would suffer)",
    )
    p.add_argument(
        "--sequential",
        action="store_true",
        help="allow seeds beyond those an earlier report judged: "
        "a sequential design, each look judged at α / (looks so far)",
    )
    p.add_argument("--redo-flagged", action="store_true", help="rerun finished runs flagged as off-budget or slow")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its cost, then stop")
    p.add_argument("--report-only", action="store_true", help="only write the report from what has finished")
    args = p.parse_intermixed_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise SpeedrunError(f"unrecognised argument {bad[0]!r}: overrides look like key=value (see --help)")
    return args


def compose(overrides: list):
    """The TrainConfig train.py would run with these overrides (Hydra's compose API + train.py's own checks), with a
    step count: the speedrun sets trainer.max_steps itself (calibrated) once it has timed a probe."""
    try:
        return compose_run_config([SEARCH_PATH, *overrides, "trainer.max_steps=1"])
    except ValueError as e:
        raise SpeedrunError(f"{' '.join(overrides)} does not compose: {one_line(e)}")


def evaluate(checkpoint: Path, json_path: Path) -> int:
    """scripts/evaluate.py CHECKPOINT --json JSON_PATH: the whole validation split."""
    return subprocess.call(
        [sys.executable, str(REPO / "scripts" / "evaluate.py"), str(checkpoint), "--json", str(json_path)]
    )


def machine() -> str:
    import torch

    from training.loop import resolve_precision

    cpu = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            platform.processor(),
        )
        if Path("/proc/cpuinfo").exists()
        else platform.processor()
    )
    precision, why = resolve_precision("auto", torch.device("cpu"))
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {precision} ({why})"


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = load_spec(
        args.recipes,
        seeds=args.seeds,
        budget_s=args.budget,
        tolerance=args.tolerance,
        probe_steps=args.probe_steps,
        reference=args.reference,
    )
    spec.train_overrides += args.overrides
    c = Campaign(args, spec, compose, evaluate)
    if not args.report_only:
        todo = c.to_do()
        print(cost(c, todo), flush=True)
        check_added_seeds(
            c.looks(), {n: range(spec.seeds) for n in c.run_names}, args.sequential, "or use another --dir"
        )
        if args.dry_run:
            return 0
        check_step_cost(c)
        for name in dict.fromkeys(n for n, _ in todo):
            calibrate(c, name)
        for name, seed in todo:
            measure(c, name, seed, c.calibration(name))
    results = c.all_results()
    calibrations = {n: c.calibration(n) or {} for n in spec.recipes if (c.dir / n).is_dir()}
    c.dir.mkdir(parents=True, exist_ok=True)
    text = report(spec, results, calibrations, machine(), c.save_look(results, args.sequential))
    (c.dir / "report.md").write_text(text)
    print(text + f"\nreport: {c.dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    run(main, interrupted=STOPPED)
