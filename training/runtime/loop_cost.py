"""How long a training loop takes — the one cost model of the project. trainer.time_budget plans a run's steps
with it (training/budget.py), the speedrun calibrates each recipe's steps to its budget with it, and the
ablation and μP experiments price their plans with it (analysis/).

A loop spends `step_s` per optimizer step, `eval_s` per evaluation (every eval_interval steps and at the last
step), `save_s` per checkpoint (every ckpt_interval steps, and the final one when it is counted) and `fixed_s`
once (compiling, warm-up, what is already spent). Throughput is read from a run's metrics one way:
`steady_tokens_per_s`.
"""
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple


def events_between(first: int, last: int, interval: int) -> int:
    """Multiples of `interval` in (first, last]."""
    return last // interval - first // interval


def event_counts(steps: int, eval_interval, ckpt_interval: int, start: int = 0,
                 final_save: bool = True) -> Tuple[int, int]:
    """(evaluations, checkpoints) a loop makes from `start` to `steps`: those due at `start` itself included
    when start > 0 (a plan made at a step comes before its events), the last step's evaluation included, and
    its final checkpoint when `final_save` (else only the periodic ones before the last step). `eval_interval`:
    steps, or a function of the run's length (TrainerConfig.eval_every: evaluations sized to the run)."""
    if callable(eval_interval):
        eval_interval = eval_interval(steps)
    since = max(start, 1) - 1
    evals = events_between(since, steps, eval_interval) + (steps % eval_interval != 0)
    if final_save:
        saves = events_between(since, steps, ckpt_interval) + (steps % ckpt_interval != 0)
    else:
        saves = events_between(since, steps - 1, ckpt_interval)
    return evals, saves


@dataclass(frozen=True)
class LoopCost:
    """Seconds a training loop spends: per step, per evaluation, per checkpoint, and once."""
    step_s: float
    eval_s: float
    save_s: float
    fixed_s: float

    def seconds(self, steps: int, eval_interval: int, ckpt_interval: int, start: int = 0,
                final_save: bool = True) -> float:
        """The loop's seconds up to `steps`: fixed_s, then the steps after `start` with their events."""
        evals, saves = event_counts(steps, eval_interval, ckpt_interval, start, final_save)
        return self.fixed_s + (steps - start) * self.step_s + evals * self.eval_s + saves * self.save_s

    def most_steps_within(self, budget_s: float, eval_interval: int, ckpt_interval: int, start: int = 0,
                          final_save: bool = True) -> int:
        """The most steps whose loop fits `budget_s` (seconds() grows with steps); at least `start`: a loop
        already past its budget ends where it is."""
        lo, hi = start, max(start + 1, start + int(2 * budget_s / max(self.step_s, 1e-9)) + 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            fits = self.seconds(mid, eval_interval, ckpt_interval, start, final_save) <= budget_s
            lo, hi = (mid, hi) if fits else (lo, mid - 1)
        return lo

    @classmethod
    def at_throughput(cls, tokens_per_step: int, tokens_per_s: float, eval_s: float = 0.0,
                      fixed_s: float = 0.0) -> "LoopCost":
        """A loop whose steps run at `tokens_per_s` (a measured throughput), checkpoints not counted."""
        return cls(step_s=tokens_per_step / tokens_per_s, eval_s=eval_s, save_s=0.0, fixed_s=fixed_s)


def steady_tokens_per_s(rows: Sequence[dict]) -> Optional[float]:
    """A run's training throughput: the median over its logged intervals (metrics.jsonl's train rows), the
    first (allocator, thread-pool and compile warm-up) left out when at least two others remain; None when
    no row is timed."""
    rates = [r["tokens_per_s"] for r in rows if r.get("kind", "train") == "train" and r.get("tokens_per_s")]
    rates = rates[1:] if len(rates) > 2 else rates
    return statistics.median(rates) if rates else None
