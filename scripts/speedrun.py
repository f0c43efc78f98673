"""The speedrun: each recipe trained for the same wall-clock budget on seeds 0..N-1, scored on the
whole validation split, and judged against the reference with paired seed statistics.

    python scripts/speedrun.py --lock /tmp/minillama-cpu.lock                # every recipe, 2 seeds, 10 min each
    python scripts/speedrun.py --only baseline,muon --seeds 3                 # a subset, more seeds
    python scripts/speedrun.py --dry-run                                      # the plan and its cost only
    python scripts/speedrun.py --report-only                                  # the report from what finished

Per recipe (configs/speedrun/recipes.yaml: train.py overrides on top of the defaults) a short probe
run measures the step, eval and checkpoint times and the compile time; trainer.max_steps is set so
that the training loop takes the budget (the same steps for every seed, so seeds stay paired). The
budget is train.py's loop: from the first step to the final checkpoint, compile, evals and checkpoints
included; interpreter start-up, data preparation and the final full-split evaluation are not (see
docs/speedrun.md). Every run uses logger=none (wandb's background process would take CPU time).
Resumable: finished runs are kept, a run cut off midway is moved to <dir>/discarded/ and redone.
Trailing key=value arguments go to every run (e.g. data.cache_dir=…). Exit status: 0 done, 1 an error.
"""
import argparse
import contextlib
import fcntl
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from analysis import speedrun as S  # noqa: E402
from analysis.speedrun_report import report  # noqa: E402
from training.metrics import read_metrics  # noqa: E402

DEFAULT_RECIPES = REPO / "configs" / "speedrun" / "recipes.yaml"
ALWAYS = ["logger=none"]  # measured runs: no wandb process competing for the 2 cores
START_GUESS_S, EVAL_GUESS_S, PROBE_GUESS_S = 30.0, 30.0, 150.0  # before anything was measured (2-core CPU)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="train.py overrides for every run")
    p.add_argument("--recipes", type=Path, default=DEFAULT_RECIPES, help="the recipes file")
    p.add_argument("--dir", type=Path, default=Path("runs/speedrun"), help="where runs live (resumed if it exists)")
    p.add_argument("--only", help="comma-separated recipes to run (the report covers every recipe with results)")
    p.add_argument("--seeds", type=int, help="seeds 0..N-1 per recipe (default: the file's)")
    p.add_argument("--budget", type=float, help="seconds of training loop per run (default: the file's)")
    p.add_argument("--tolerance", type=float, help="allowed miss of the budget, a fraction (default: the file's)")
    p.add_argument("--probe-steps", type=int, help="steps of the timing run (default: the file's)")
    p.add_argument("--reference", help="the recipe every other one is judged against")
    p.add_argument("--lock", type=Path, help="hold an flock on this file during each run, probe and evaluation, "
                   "so other jobs sharing the machine never run at the same time (their timing would suffer)")
    p.add_argument("--redo-flagged", action="store_true", help="rerun finished runs flagged as off-budget or slow")
    p.add_argument("--dry-run", action="store_true", help="print the plan and its cost, then stop")
    p.add_argument("--report-only", action="store_true", help="only write the report from what has finished")
    args = p.parse_intermixed_args(argv)
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        raise S.SpeedrunError(f"unrecognised argument {bad[0]!r}: overrides look like key=value (see --help)")
    return args


@contextlib.contextmanager
def cpu_lock(path):
    """Hold an exclusive flock on `path` (the same lock as `flock FILE command`), or nothing without one."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the lock {path} (another job is using the machine)", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases it


class Campaign:
    def __init__(self, args, spec: S.Spec):
        self.args, self.spec, self.dir = args, spec, args.dir.resolve()
        self.run_names = [n.strip() for n in args.only.split(",")] if args.only else list(spec.recipes)
        unknown = [n for n in self.run_names if n not in spec.recipes]
        if unknown:
            raise S.SpeedrunError(f"--only: unknown recipe(s) {', '.join(unknown)}; {args.recipes} has "
                                  f"{', '.join(spec.recipes)}")

    def overrides(self, name: str) -> list:
        return [*ALWAYS, *self.spec.train_overrides, *self.spec.recipes[name]]

    def seed_dir(self, name: str, seed: int) -> Path:
        return self.dir / name / f"seed{seed}"

    def calibration(self, name: str):
        path = self.dir / name / "calibration.json"
        if not path.is_file():
            return None
        stored = json.loads(path.read_text())
        if stored["overrides"] != self.overrides(name) or stored["budget_s"] != self.spec.budget_s \
                or stored.get("step_cost") != self.spec.step_cost.get(name):
            how = (f"the reference's probe × {stored['step_cost']:g}" if stored.get("step_cost") is not None
                   else "its own probe")
            raise S.SpeedrunError(f"{path} was calibrated for {' '.join(stored['overrides'])} at a "
                                  f"{stored['budget_s']:g} s budget from {how}; a recipe must not change under its "
                                  "name: rename it or use another --dir")
        return stored

    def result(self, name: str, seed: int):
        path = self.seed_dir(name, seed) / "result.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def to_do(self) -> list:
        todo = []
        for seed in range(self.spec.seeds):  # seed-major: every recipe's seed 0 first, so pairs come early
            for name in self.run_names:
                result = self.result(name, seed)
                if result is None or (self.args.redo_flagged and result.get("flags")):
                    todo.append((name, seed))
        return todo

    def all_results(self) -> dict:
        return {name: {seed: r for seed in range(_max_seed(self.dir / name)) if (r := self.result(name, seed))}
                for name in self.spec.recipes}


def _max_seed(recipe_dir: Path) -> int:
    seeds = [int(p.name[4:]) for p in recipe_dir.glob("seed*") if p.name[4:].isdigit()]
    return max(seeds, default=-1) + 1


def compose(overrides: list):
    from scripts.estimate import compose_config  # Hydra's compose API + train.py's own checks
    from hydra.errors import HydraException
    try:
        return compose_config(overrides)
    except (HydraException, ValueError) as e:
        raise S.SpeedrunError(f"{' '.join(overrides)} does not compose: {str(e).strip().splitlines()[0]}")


def train(overrides: list, run_dir: Path, log_path: Path, lock) -> tuple:
    """Run train.py into run_dir under the lock: (exit status, wall seconds, load average before and after)."""
    command = [sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={_quoted(run_dir)}"]
    # Every probe and run compiles cold, in an inductor cache of its own: with one shared cache the first
    # probe paid ~30 s of compiling that later runs skipped, so they all ran 5-11 % under the budget.
    with cpu_lock(lock), open(log_path, "w") as log, tempfile.TemporaryDirectory(prefix="speedrun-inductor-") as cache:
        load_before, start = os.getloadavg()[0], time.time()
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
        try:
            code = proc.wait()
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached train.py too: let it save and stop
            proc.wait()
            raise
        return code, time.time() - start, load_before, os.getloadavg()[0]


def _quoted(path: Path) -> str:
    text = str(path)
    return text if all(c.isalnum() or c in "_./:-" for c in text) else "'" + text.replace("'", "\\'") + "'"


def final_state(run_dir: Path, steps: int) -> dict:
    path = run_dir / "checkpoints" / f"step_{steps:07d}" / "state.json"
    if not path.is_file():
        raise S.SpeedrunError(f"{run_dir} has no final checkpoint step_{steps:07d}; see its train.log")
    return json.loads(path.read_text())


def discard(path: Path, root: Path) -> None:
    """A run cut off midway: kept for inspection, out of the way."""
    if path.exists():
        target = root / "discarded" / time.strftime("%Y-%m-%d_%H-%M-%S") / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(path), str(target))
        print(f"moved the unfinished {path.relative_to(root)} to {target.relative_to(root)}")


def calibrate(c: Campaign, name: str) -> dict:
    """The probe run, decomposed into the loop's costs, and the steps that fill the budget."""
    stored = c.calibration(name)
    if stored is not None:
        return stored
    if name in c.spec.step_cost:  # the reference's probe, its step time scaled (see Spec.step_cost)
        reference, factor = calibrate(c, c.spec.reference), c.spec.step_cost[name]
        timing = S.scaled(S.Timing(**reference["timing"]), factor)
        steps = S.steps_for_budget(timing, c.spec.budget_s, reference["eval_interval"], reference["ckpt_interval"])
        stored = {**reference, "overrides": c.overrides(name), "steps_from": c.spec.reference, "step_cost": factor,
                  "max_steps": steps, "timing": asdict(timing),
                  "predicted_loop_s": S.predict_loop_s(timing, steps, reference["eval_interval"],
                                                       reference["ckpt_interval"])}
        (c.dir / name).mkdir(parents=True, exist_ok=True)
        (c.dir / name / "calibration.json").write_text(json.dumps(stored, indent=2) + "\n")
        print(f"==> {name}: the reference's probe, a step × {factor:g} → max_steps {steps}", flush=True)
        return stored
    cfg = compose(c.overrides(name))
    t = cfg.trainer
    tokens_per_step = t.micro_batch_size * t.seq_len * t.grad_accum_steps
    probe_dir = c.dir / name / "probe"
    discard(probe_dir, c.dir)
    probe_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"==> {name}: probe ({c.spec.probe_steps} steps) → {probe_dir.parent / 'probe.log'}", flush=True)
    code, _, _, _ = train([*c.overrides(name), *S.probe_overrides(c.spec.probe_steps), "seed=0"], probe_dir,
                          probe_dir.parent / "probe.log", c.args.lock)
    if code != 0:
        raise S.SpeedrunError(f"{name}: the probe run failed (exit {code}); see {probe_dir.parent / 'probe.log'}")
    state = final_state(probe_dir, c.spec.probe_steps)
    timing = S.timing_from_probe(read_metrics(probe_dir / "metrics.jsonl"), state["elapsed_s"], c.spec.probe_steps,
                                 tokens_per_step, state.get("best_step"))
    steps = S.steps_for_budget(timing, c.spec.budget_s, t.eval_interval, t.ckpt_interval)
    stored = {"overrides": c.overrides(name), "budget_s": c.spec.budget_s, "probe_steps": c.spec.probe_steps,
              "max_steps": steps, "tokens_per_step": tokens_per_step, "eval_interval": t.eval_interval,
              "ckpt_interval": t.ckpt_interval, "timing": asdict(timing),
              "predicted_loop_s": S.predict_loop_s(timing, steps, t.eval_interval, t.ckpt_interval)}
    (c.dir / name / "calibration.json").write_text(json.dumps(stored, indent=2) + "\n")
    print(f"    step {timing.step_s:.3f} s ({timing.tokens_per_s:,.0f} tokens/s), eval {timing.eval_s:.1f} s, save "
          f"{timing.save_s:.1f} s, compile + warm-up {timing.fixed_s:.1f} s → max_steps {steps}", flush=True)
    return stored


def check_step_cost(c: Campaign) -> None:
    """Before anything trains: a recipe calibrated from the reference's probe may change only what
    scripts/bench_model.py times side by side, the optimizer (--optim) and the depth (--layers): its
    data, trainer and every other model field must be the reference's as composed."""
    theirs = compose(c.overrides(c.spec.reference))
    for name in c.run_names:
        if name in c.spec.step_cost:
            mine = compose(c.overrides(name))
            differs = [k for k in ("data", "trainer") if getattr(mine, k) != getattr(theirs, k)]
            if replace(mine.model, n_layers=theirs.model.n_layers) != theirs.model:
                differs.insert(0, "model")
            if differs:
                raise S.SpeedrunError(f"step_cost: {name} changes {', '.join(differs)}, not only the optimizer or the "
                                      "depth, so no side-by-side factor times it: take it out of step_cost (it then "
                                      "gets its own probe)")


def measure(c: Campaign, name: str, seed: int, cal: dict) -> dict:
    """One run at the calibrated steps, its final checkpoint scored on the whole validation split."""
    from scripts.evaluate import main as evaluate
    out = c.seed_dir(name, seed)
    discard(out, c.dir)
    out.mkdir(parents=True)
    run_dir, steps = out / "train", cal["max_steps"]
    print(f"==> {name} seed {seed}: {steps} steps → {out / 'train.log'}", flush=True)
    code, wall, load_before, load_after = train([*c.overrides(name), f"trainer.max_steps={steps}", f"seed={seed}"],
                                                run_dir, out / "train.log", c.args.lock)
    if code != 0:
        raise S.SpeedrunError(f"{name} seed {seed}: train.py failed (exit {code}); see {out / 'train.log'}")
    state, rows = final_state(run_dir, steps), read_metrics(run_dir / "metrics.jsonl")
    with cpu_lock(c.args.lock), open(out / "eval.log", "w") as log, contextlib.redirect_stdout(log), \
            contextlib.redirect_stderr(log):
        start = time.time()  # not before the lock: waiting for another job is not evaluating
        if evaluate([str(run_dir / "checkpoints" / f"step_{steps:07d}"), "--json", str(out / "eval.json")]) != 0:
            raise S.SpeedrunError(f"{name} seed {seed}: evaluation failed; see {out / 'eval.log'}")
    scored = json.loads((out / "eval.json").read_text())
    tps = S.steady_tokens_per_s(rows)
    result = {"recipe": name, "seed": seed, "max_steps": steps, "tokens": state["tokens_seen"],
              "loop_s": state["elapsed_s"], "budget_s": c.spec.budget_s, "tokens_per_s": tps,
              "bpb": scored["bits_per_byte"], "loss": scored["loss"], "eval_tokens": scored["tokens"],
              "train_wall_s": wall, "eval_wall_s": time.time() - start, "load_before": load_before,
              "load_after": load_after, "flags": S.run_flags(state["elapsed_s"], c.spec.budget_s, c.spec.tolerance,
                                                             tps, cal["timing"]["tokens_per_s"])}
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(f"    {result['bpb']:.4f} bpb, loop {result['loop_s']:.0f} s ({result['loop_s'] / c.spec.budget_s - 1:+.1%}), "
          f"{tps:,.0f} tokens/s, load {load_before:.1f} → {load_after:.1f}"
          + "".join(f"\n    ⚠ {f}" for f in result["flags"]), flush=True)
    return result


def cost(c: Campaign, todo: list) -> str:
    """What is left, from what this directory measured so far (or guesses before anything was)."""
    done = [r for runs in c.all_results().values() for r in runs.values()]
    start = _median([r["train_wall_s"] - r["loop_s"] for r in done]) or START_GUESS_S
    evaluation = _median([r["eval_wall_s"] for r in done]) or EVAL_GUESS_S
    probes = {c.spec.reference if n in c.spec.step_cost else n for n in c.run_names
              if c.calibration(n) is None and any(name == n for name, _ in todo)}
    probes = [n for n in probes if c.calibration(n) is None]
    total = len(probes) * PROBE_GUESS_S + len(todo) * (c.spec.budget_s + start + evaluation)
    return (f"to do: {len(probes)} probe(s) (~{PROBE_GUESS_S:.0f} s each) and {len(todo)} run(s) × ({c.spec.budget_s:g} s "
            f"budget + ~{start:.0f} s start-up + ~{evaluation:.0f} s evaluation) ≈ {total / 60:.0f} min "
            f"({', '.join(f'{n}/seed{s}' for n, s in todo) or 'nothing'})")


def _median(values: list):
    values = sorted(values)
    return values[len(values) // 2] if values else None


def machine() -> str:
    import torch
    from training.precision import resolve_precision
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").exists() \
        else platform.processor()
    precision, why = resolve_precision("auto", torch.device("cpu"))
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {precision} ({why})"


def main(argv=None) -> int:
    args = parse_args(argv)
    spec = S.load_spec(args.recipes, seeds=args.seeds, budget_s=args.budget, tolerance=args.tolerance,
                       probe_steps=args.probe_steps, reference=args.reference)
    spec.train_overrides += args.overrides
    c = Campaign(args, spec)
    if not args.report_only:
        todo = c.to_do()
        print(cost(c, todo), flush=True)
        if args.dry_run:
            return 0
        check_step_cost(c)
        for name in dict.fromkeys(n for n, _ in todo):
            calibrate(c, name)
        for name, seed in todo:
            measure(c, name, seed, c.calibration(name))
    results = c.all_results()
    calibrations = {n: c.calibration(n) or {} for n in spec.recipes if (c.dir / n).is_dir()}
    text = report(spec, results, calibrations, machine())
    c.dir.mkdir(parents=True, exist_ok=True)
    (c.dir / "report.md").write_text(text)
    print(text + f"\nreport: {c.dir / 'report.md'}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ValueError, OSError) as e:  # SpeedrunError is a ValueError
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("stopped: rerun the same command to continue (finished runs are kept)", file=sys.stderr)
        sys.exit(130)
