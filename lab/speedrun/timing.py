"""The speedrun's arithmetic: calibrating trainer.max_steps to a wall-clock budget from a short probe
run, and checking each measured run against that budget (lab/speedrun/campaign.py runs them). The cost
model itself — loop_s(N) = fixed_s + N·step_s + evals(N)·eval_s + saves(N)·save_s — is the project's one,
training/runtime/loop_cost.py; here the probe is decomposed into its terms."""

import statistics
from dataclasses import asdict, dataclass
from typing import List, Optional, Sequence

from analysis.runs import steady_tokens_per_s  # noqa: F401
from lab.speedrun.spec import SpeedrunError

# steady_tokens_per_s is part of this module's interface: campaign.py reads it as T.steady_tokens_per_s.
from training.budget import LoopCost, event_counts  # noqa: F401

# A run is "slow" (the machine was probably busy) when its throughput falls this far below the probe's.
SLOW_FRACTION = 0.05


def probe_overrides(probe_steps: int) -> List[str]:
    """The probe's schedule of events, so every cost of the loop is seen once in a known place:
    logs every P/4 steps, an eval at P/2 (and the final one at P), a periodic save at 3P/4."""
    quarter = probe_steps // 4
    return [
        f"trainer.max_steps={probe_steps}",
        f"trainer.log_interval={quarter}",
        f"trainer.eval_interval={2 * quarter}",
        f"trainer.ckpt_interval={3 * quarter}",
    ]


@dataclass(frozen=True)
class Timing(LoopCost):
    """What the loop costs, from a probe (LoopCost's terms; its final checkpoint is written after the loop
    clock stops, so a speedrun counts only the periodic ones): step_s one optimizer step, steady state; eval_s
    one evaluation (validation loss, the sample, the `best` checkpoint); save_s one periodic checkpoint;
    fixed_s once per run (compiling the training and eval graphs, the first steps' warm-up)."""

    compile_s: float  # the part of fixed_s torch.compile reported
    tokens_per_s: float  # steady training throughput, to compare the measured runs with
    probe_loop_s: float


def timing_from_probe(
    rows: Sequence[dict], loop_s: float, probe_steps: int, tokens_per_step: int, best_step: Optional[int]
) -> Timing:
    """Decompose the probe's loop time (rows: its metrics.jsonl train rows; loop_s: its final
    state.json elapsed_s; best_step: the step of its best checkpoint).

    Each train row times its interval's steps alone (eval, save and compile time are excluded from
    tokens_per_s), and elapsed_s includes everything, so a gap between two rows minus the steps
    between them is the event that happened there.
    """
    q = probe_steps // 4
    by_step = {r["step"]: r for r in rows if r.get("kind", "train") == "train"}
    missing = [s for s in (q, 2 * q, 3 * q, 4 * q) if s not in by_step or not by_step[s].get("tokens_per_s")]
    if missing:
        raise SpeedrunError(
            f"the probe's metrics.jsonl has no timed train row at step(s) "
            f"{', '.join(map(str, missing))}; rerun the probe"
        )
    interval = {s: q * tokens_per_step / by_step[s]["tokens_per_s"] for s in (q, 2 * q, 3 * q, 4 * q)}
    elapsed = {s: by_step[s]["elapsed_s"] for s in by_step}
    step_s = statistics.fmean(interval[s] for s in (2 * q, 3 * q, 4 * q)) / q  # the first is warm-up
    save_s = max(elapsed[4 * q] - elapsed[3 * q] - interval[4 * q], 0.0)
    eval_s = max(loop_s - elapsed[4 * q], 0.0)  # the final eval: its graph compiled at P/2 already
    if best_step != probe_steps:  # it did not improve on P/2: no `best` checkpoint was written with it
        eval_s += save_s
    fixed_s = (
        loop_s - probe_steps * step_s - n_evals(probe_steps, 2 * q) * eval_s - n_saves(probe_steps, 3 * q) * save_s
    )
    return Timing(
        step_s=step_s,
        eval_s=eval_s,
        save_s=save_s,
        fixed_s=max(fixed_s, 0.0),
        compile_s=by_step[4 * q].get("compile_s", 0.0),
        tokens_per_s=tokens_per_step / step_s,
        probe_loop_s=loop_s,
    )


def scaled(t: Timing, step_cost: float) -> Timing:
    """The reference's timing for a recipe whose steps cost step_cost times as much (compile, evals and
    checkpoints unchanged: it changes the optimizer or the depth, and a shallower model's are cheaper,
    so its step count errs low)."""
    return Timing(**{**asdict(t), "step_s": t.step_s * step_cost, "tokens_per_s": t.tokens_per_s / step_cost})


def n_evals(steps: int, eval_interval: int) -> int:
    """Evaluations in a run: every eval_interval steps, and at the last step."""
    return event_counts(steps, eval_interval, steps, final_save=False)[0]


def n_saves(steps: int, ckpt_interval: int) -> int:
    """Periodic checkpoints before the last step (the final one is written after the loop clock stops)."""
    return event_counts(steps, steps, ckpt_interval, final_save=False)[1]


def predict_loop_s(t: Timing, steps: int, eval_interval: int, ckpt_interval: int) -> float:
    return t.seconds(steps, eval_interval, ckpt_interval, final_save=False)


def steps_for_budget(t: Timing, budget_s: float, eval_interval: int, ckpt_interval: int) -> int:
    """The most steps whose predicted loop time fits the budget (loop_s grows with steps)."""
    if predict_loop_s(t, 1, eval_interval, ckpt_interval) > budget_s:
        raise SpeedrunError(
            f"even one step takes longer than the {budget_s:g} s budget (compile and warm-up "
            f"{t.fixed_s:.1f} s, a step {t.step_s:.2f} s); raise --budget"
        )
    return t.most_steps_within(budget_s, eval_interval, ckpt_interval, final_save=False)


# ---- checking a measured run -------------------------------------------------------------------------


def run_flags(
    loop_s: float, budget_s: float, tolerance: float, tokens_per_s: float, probe_tokens_per_s: float
) -> List[str]:
    """Why a measured run cannot be trusted as a budget-B run; [] when it can."""
    flags = []
    miss = loop_s / budget_s - 1
    if abs(miss) > tolerance:
        flags.append(
            f"loop time {loop_s:.0f} s is {miss:+.1%} off the {budget_s:g} s budget (tolerance ±{tolerance:.0%})"
        )
    if tokens_per_s < probe_tokens_per_s * (1 - SLOW_FRACTION):
        flags.append(
            f"{tokens_per_s:,.0f} tokens/s is {1 - tokens_per_s / probe_tokens_per_s:.0%} below the probe's "
            f"{probe_tokens_per_s:,.0f}: was the machine busy?"
        )
    return flags
