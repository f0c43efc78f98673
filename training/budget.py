"""trainer.time_budget: a run's length set by the clock. Early on — inside the warmup, where the learning
rate does not yet depend on the run's end — the run times a few training steps, one evaluation's batches
and one checkpoint, then fixes max_steps once: the schedule (cosine or WSD) ends exactly there, the
decision goes into state.json, and a resume keeps it (bitwise: the probe draws no random numbers).

What the budget covers: the training loop from its first step to its final checkpoint — compiling,
evaluations, samples and checkpoints included; interpreter start-up and data preparation are not.
"""
import time
from dataclasses import dataclass

from training.runtime import distributed as D

WARMUP_STEPS = 3  # compiling happens at the first step; the next two settle the caches
PROBE_STEPS = 20  # a 2-core machine's speed wanders ±15 % from minute to minute: average over more steps
# Plan for this share of the budget. Measured on a 2-core AMX machine (BENCHMARKS.md), runs planned for the
# whole budget overshot it by 7-12 %: the steps after the probe ran slower than the probe's.
TARGET_SHARE = 0.95


@dataclass
class Costs:
    """Seconds the rest of the run will spend, per event, as measured by the probe."""
    step: float
    eval: float  # one validation (all its batches, the activation RMS batch, the sample)
    save: float  # one checkpoint


def events_between(first: int, last: int, interval: int) -> int:
    """Multiples of `interval` in (first, last]."""
    return last // interval - first // interval


def steps_for_budget(budget_s: float, spent_s: float, at_step: int, costs: Costs, eval_interval: int,
                     ckpt_interval: int) -> int:
    """The most steps whose whole run — the `spent_s` seconds to `at_step`, then the remaining steps, their
    evaluations and checkpoints, the final ones included — fits `budget_s`. At least `at_step` (a probe
    that overran the budget ends the run where it is)."""
    def total(n: int) -> float:
        evals = events_between(at_step, n, eval_interval) + (n % eval_interval != 0)
        saves = events_between(at_step, n, ckpt_interval) + (n % ckpt_interval != 0)
        return spent_s + (n - at_step) * costs.step + evals * costs.eval + saves * costs.save

    lo, hi = at_step, max(at_step + 1, at_step + int(2 * budget_s / max(costs.step, 1e-9)) + 1)
    while lo < hi:  # total() grows with n: the largest n with total(n) <= budget_s
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total(mid) <= budget_s else (lo, mid - 1)
    return lo


class TimeBudget:
    """Probes at steps WARMUP_STEPS..WARMUP_STEPS + PROBE_STEPS, then fixes state.max_steps once."""

    def __init__(self, minutes: float, started: float, device):
        self.minutes, self.budget_s, self.started, self.device = minutes, 60.0 * minutes, started, device
        self.probe_start = None

    def after_step(self, state, validator, checkpointer, log, tokens_per_step: int, info) -> None:
        """The loop calls this after every step; it acts twice: when the probe begins and when it ends."""
        if state.step == WARMUP_STEPS:
            self.probe_start = self._now()
        elif state.step == WARMUP_STEPS + PROBE_STEPS:
            step_s = (self._now() - self.probe_start) / PROBE_STEPS
            eval_s, save_s = validator.time_one(), checkpointer.time_one(state)
            costs = Costs(step=step_s, eval=eval_s, save=save_s)
            trainer = validator.cfg.trainer
            decided = steps_for_budget(TARGET_SHARE * self.budget_s, self._now() - self.started, state.step, costs,
                                       trainer.eval_interval, trainer.ckpt_interval)
            (decided,) = D.agree_max([decided], info)  # every rank ends at the same step (rank 0's clock may differ)
            state.plan_budget(self.minutes, decided)
            log.set_total(decided)
            log.write(describe(self.minutes, decided, costs, tokens_per_step))

    def _now(self) -> float:
        if self.device.type == "cuda":  # note: a CPU-GPU sync point, twice per run
            import torch
            torch.cuda.synchronize(self.device)
        return time.time()


def describe(minutes: float, max_steps: int, costs: Costs, tokens_per_step: int) -> str:
    """The decision, as the run prints it."""
    return (f"time budget {minutes:g} min → {max_steps:,} steps at {tokens_per_step / costs.step:,.0f} tok/s "
            f"(step {costs.step * 1000:.0f} ms, eval {costs.eval:.1f} s, checkpoint {costs.save:.1f} s, "
            f"measured over steps {WARMUP_STEPS + 1}–{WARMUP_STEPS + PROBE_STEPS})")
