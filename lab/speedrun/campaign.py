"""Running the speedrun: a probe calibrates each recipe's trainer.max_steps to the budget, every seed
trains those steps, its final checkpoint is scored on the whole validation split; a cut-off run is moved
aside and redone. Composing a config and scoring a checkpoint are passed in (cli/speedrun.py)."""

import contextlib
import json
import math
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable, Optional

from lab.launcher import Job, Launcher, cpu_lock, move_aside
from lab.looks import record as looks_record
from lab.speedrun import timing as T
from lab.speedrun.spec import Spec, SpeedrunError
from training.checkpoint import RunFiles, checkpoint_name, read_state
from training.log import read_metrics

LOOKS = "looks.json"  # every report written: which seeds of which recipe it judged (analysis/looks.py)
# Measured runs: no wandb process competing for the 2 cores; the speedrun sets trainer.max_steps itself.
ALWAYS = ["logger=none", "trainer.time_budget=null"]
START_GUESS_S, EVAL_GUESS_S, PROBE_GUESS_S = 30.0, 30.0, 150.0  # before anything was measured (2-core CPU)

Compose = Callable[[list], object]  # train.py overrides → the TrainConfig it would run (a SpeedrunError if not)
Evaluate = Callable[[Path, Path], int]  # (checkpoint, JSON file to write its scores into) → exit status


class Campaign:
    """The runs directory of a speedrun: its recipes' calibrations and results, and how to run more."""

    def __init__(self, args, spec: Spec, compose: Optional[Compose] = None, evaluate: Optional[Evaluate] = None):
        self.args, self.spec, self.dir = args, spec, args.dir.resolve()
        self.compose, self.evaluate = compose, evaluate
        self.run_names = [n.strip() for n in args.only.split(",")] if args.only else list(spec.recipes)
        unknown = [n for n in self.run_names if n not in spec.recipes]
        if unknown:
            raise SpeedrunError(
                f"--only: unknown recipe(s) {', '.join(unknown)}; {args.recipes} has {', '.join(spec.recipes)}"
            )

    def overrides(self, name: str) -> list:
        return [*ALWAYS, *self.spec.train_overrides, *self.spec.recipes[name]]

    def seed_dir(self, name: str, seed: int) -> Path:
        return self.dir / name / f"seed{seed}"

    def calibration(self, name: str):
        path = self.dir / name / "calibration.json"
        if not path.is_file():
            return None
        stored = json.loads(path.read_text())
        if (
            stored["overrides"] != self.overrides(name)
            or stored["budget_s"] != self.spec.budget_s
            or stored.get("step_cost") != self.spec.step_cost.get(name)
        ):
            how = (
                f"the reference's probe × {stored['step_cost']:g}"
                if stored.get("step_cost") is not None
                else "its own probe"
            )
            raise SpeedrunError(
                f"{path} was calibrated for {' '.join(stored['overrides'])} at a "
                f"{stored['budget_s']:g} s budget from {how}; a recipe must not change under its "
                "name: rename it or use another --dir"
            )
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

    def looks(self) -> list:
        path = self.dir / LOOKS
        return json.loads(path.read_text()) if path.is_file() else []

    def save_look(self, results: dict, sequential: bool) -> list:
        """A report is a look: record, per recipe, the seeds it judged (this invocation's planned seeds for
        the recipes it ran, so that finishing an interrupted plan is never an added seed)."""
        seeds = {
            name: sorted(set(runs) | (set(range(self.spec.seeds)) if name in self.run_names else set()))
            for name, runs in results.items()
            if runs
        }
        looks = looks_record(self.looks(), seeds, sequential)
        (self.dir / LOOKS).write_text(json.dumps(looks, indent=1) + "\n")
        return looks

    def all_results(self) -> dict:
        return {
            name: {seed: r for seed in range(_max_seed(self.dir / name)) if (r := self.result(name, seed))}
            for name in self.spec.recipes
        }


def _max_seed(recipe_dir: Path) -> int:
    seeds = [int(p.name[4:]) for p in recipe_dir.glob("seed*") if p.name[4:].isdigit()]
    return max(seeds, default=-1) + 1


def train(overrides: list, run_dir: Path, log_path: Path, lock) -> tuple:
    """Run train.py into run_dir under the lock: (exit status, wall seconds, load average before and after)."""
    # Every probe and run compiles cold, in an inductor cache of its own: with one shared cache the first
    # probe paid ~30 s of compiling that later runs skipped, so they all ran 5-11 % under the budget.
    with tempfile.TemporaryDirectory(prefix="speedrun-job-") as options:
        launcher = Launcher(Path(options), overrides, lock=lock, cold_compile=True)
        (ended,) = launcher.run([Job(run_dir, log=log_path)])
    return ended.exit_code, ended.wall_s, *ended.load


def final_state(run_dir: Path, steps: int) -> dict:
    try:
        return read_state(RunFiles(run_dir).checkpoints / checkpoint_name(steps))
    except OSError:
        raise SpeedrunError(f"{run_dir} has no final checkpoint {checkpoint_name(steps)}; see its train.log") from None


def discard(path: Path, root: Path) -> None:
    """A run cut off midway: kept for inspection, out of the way."""
    if path.exists():
        target = move_aside(path, root / "discarded", path.relative_to(root))
        print(f"moved the unfinished {path.relative_to(root)} to {target.relative_to(root)}")


def calibrate(c: Campaign, name: str) -> dict:
    """The probe run, decomposed into the loop's costs, and the steps that fill the budget."""
    stored = c.calibration(name)
    if stored is not None:
        return stored
    if name in c.spec.step_cost:  # the reference's probe, its step time scaled (see Spec.step_cost)
        reference, factor = calibrate(c, c.spec.reference), c.spec.step_cost[name]
        timing = T.scaled(T.Timing(**reference["timing"]), factor)
        steps = T.steps_for_budget(timing, c.spec.budget_s, reference["eval_interval"], reference["ckpt_interval"])
        stored = {
            **reference,
            "overrides": c.overrides(name),
            "steps_from": c.spec.reference,
            "step_cost": factor,
            "max_steps": steps,
            "timing": asdict(timing),
            "predicted_loop_s": T.predict_loop_s(timing, steps, reference["eval_interval"], reference["ckpt_interval"]),
        }
        (c.dir / name).mkdir(parents=True, exist_ok=True)
        (c.dir / name / "calibration.json").write_text(json.dumps(stored, indent=2) + "\n")
        print(f"==> {name}: the reference's probe, a step × {factor:g} → max_steps {steps}", flush=True)
        return stored
    cfg = c.compose(c.overrides(name))
    t = cfg.trainer
    tokens_per_step = t.micro_batch_size * t.seq_len * t.grad_accum_steps
    probe_dir = c.dir / name / "probe"
    discard(probe_dir, c.dir)
    probe_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"==> {name}: probe ({c.spec.probe_steps} steps) → {probe_dir.parent / 'probe.log'}", flush=True)
    code, _, _, _ = train(
        [*c.overrides(name), *T.probe_overrides(c.spec.probe_steps), "seed=0"],
        probe_dir,
        probe_dir.parent / "probe.log",
        c.args.lock,
    )
    if code != 0:
        raise SpeedrunError(f"{name}: the probe run failed (exit {code}); see {probe_dir.parent / 'probe.log'}")
    state = final_state(probe_dir, c.spec.probe_steps)
    timing = T.timing_from_probe(
        read_metrics(RunFiles(probe_dir).metrics),
        state["elapsed_before"],
        c.spec.probe_steps,
        tokens_per_step,
        state.get("best_step"),
    )
    steps = T.steps_for_budget(timing, c.spec.budget_s, t.eval_interval, t.ckpt_interval)
    stored = {
        "overrides": c.overrides(name),
        "budget_s": c.spec.budget_s,
        "probe_steps": c.spec.probe_steps,
        "max_steps": steps,
        "tokens_per_step": tokens_per_step,
        "eval_interval": t.eval_interval,
        "ckpt_interval": t.ckpt_interval,
        "timing": asdict(timing),
        "predicted_loop_s": T.predict_loop_s(timing, steps, t.eval_interval, t.ckpt_interval),
    }
    (c.dir / name / "calibration.json").write_text(json.dumps(stored, indent=2) + "\n")
    print(
        f"    step {timing.step_s:.3f} s ({timing.tokens_per_s:,.0f} tokens/s), eval {timing.eval_s:.1f} s, save "
        f"{timing.save_s:.1f} s, compile + warm-up {timing.fixed_s:.1f} s → max_steps {steps}",
        flush=True,
    )
    return stored


def check_step_cost(c: Campaign) -> None:
    """Before anything trains: a recipe calibrated from the reference's probe may change only what
    dev/bench/model.py times side by side, the optimizer (--optim) and the depth (--layers): its
    data, trainer and every other model field must be the reference's as composed."""
    theirs = c.compose(c.overrides(c.spec.reference))
    for name in c.run_names:
        if name in c.spec.step_cost:
            mine = c.compose(c.overrides(name))
            differs = [k for k in ("data", "trainer") if getattr(mine, k) != getattr(theirs, k)]
            if replace(mine.model, n_layers=theirs.model.n_layers) != theirs.model:
                differs.insert(0, "model")
            if differs:
                raise SpeedrunError(
                    f"step_cost: {name} changes {', '.join(differs)}, not only the optimizer or the "
                    "depth, so no side-by-side factor times it: take it out of step_cost (it then "
                    "gets its own probe)"
                )


def measure(c: Campaign, name: str, seed: int, cal: dict) -> dict:
    """One run at the calibrated steps, its final checkpoint scored on the whole validation split."""
    out = c.seed_dir(name, seed)
    discard(out, c.dir)
    out.mkdir(parents=True)
    run_dir, steps = out / "train", cal["max_steps"]
    print(f"==> {name} seed {seed}: {steps} steps → {out / 'train.log'}", flush=True)
    code, wall, load_before, load_after = train(
        [*c.overrides(name), f"trainer.max_steps={steps}", f"seed={seed}"], run_dir, out / "train.log", c.args.lock
    )
    if code != 0:
        raise SpeedrunError(f"{name} seed {seed}: train.py failed (exit {code}); see {out / 'train.log'}")
    state, rows = final_state(run_dir, steps), read_metrics(RunFiles(run_dir).metrics)
    with (
        cpu_lock(c.args.lock),
        open(out / "eval.log", "w") as log,
        contextlib.redirect_stdout(log),
        contextlib.redirect_stderr(log),
    ):
        start = time.time()  # not before the lock: waiting for another job is not evaluating
        if c.evaluate(RunFiles(run_dir).checkpoints / checkpoint_name(steps), out / "eval.json") != 0:
            raise SpeedrunError(f"{name} seed {seed}: evaluation failed; see {out / 'eval.log'}")
    scored = json.loads((out / "eval.json").read_text())
    tps = T.steady_tokens_per_s(rows) or math.nan  # no timed row: every comparison with it is false
    result = {
        "recipe": name,
        "seed": seed,
        "max_steps": steps,
        "tokens": state["tokens_seen"],
        "loop_s": state["elapsed_before"],
        "budget_s": c.spec.budget_s,
        "tokens_per_s": tps,
        "bpb": scored["bits_per_byte"],
        "loss": scored["loss"],
        "eval_tokens": scored["tokens"],
        "train_wall_s": wall,
        "eval_wall_s": time.time() - start,
        "load_before": load_before,
        "load_after": load_after,
        "flags": T.run_flags(
            state["elapsed_before"], c.spec.budget_s, c.spec.tolerance, tps, cal["timing"]["tokens_per_s"]
        ),
    }
    (out / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"    {result['bpb']:.4f} bpb, loop {result['loop_s']:.0f} s ({result['loop_s'] / c.spec.budget_s - 1:+.1%}), "
        f"{tps:,.0f} tokens/s, load {load_before:.1f} → {load_after:.1f}"
        + "".join(f"\n    ⚠ {f}" for f in result["flags"]),
        flush=True,
    )
    return result


def cost(c: Campaign, todo: list) -> str:
    """What is left, from what this directory measured so far (or guesses before anything was)."""
    done = [r for runs in c.all_results().values() for r in runs.values()]
    start = _median([r["train_wall_s"] - r["loop_s"] for r in done]) or START_GUESS_S
    evaluation = _median([r["eval_wall_s"] for r in done]) or EVAL_GUESS_S
    probes = {
        c.spec.reference if n in c.spec.step_cost else n
        for n in c.run_names
        if c.calibration(n) is None and any(name == n for name, _ in todo)
    }
    probes = [n for n in probes if c.calibration(n) is None]
    total = len(probes) * PROBE_GUESS_S + len(todo) * (c.spec.budget_s + start + evaluation)
    return (
        f"to do: {len(probes)} probe(s) (~{PROBE_GUESS_S:.0f} s each) and {len(todo)} run(s) × ({c.spec.budget_s:g} s "
        f"budget + ~{start:.0f} s start-up + ~{evaluation:.0f} s evaluation) ≈ {total / 60:.0f} min "
        f"({', '.join(f'{n}/seed{s}' for n, s in todo) or 'nothing'})"
    )


def _median(values: list):
    values = sorted(values)
    return values[len(values) // 2] if values else None
