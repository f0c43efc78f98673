"""trainer.time_budget: max_steps planned from the measured speed (steps, evaluations, checkpoints, compiling) and
re-planned as a shared machine's speed moves; never past max_steps / max_epochs (`cap`). docs/training.md."""

import collections
import math
import time
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import torch

from training import distributed as D
from training.optim import UNPLANNED_END

WARMUP_STEPS = 3  # compiling happens at the first step; the next two settle the caches
PROBE_STEPS = 20  # the first plan's speed: a mean over this many steps
REPLAN_SHARE = 0.05  # plan again at least every 5 % of the budget
MIN_WINDOW_STEPS = 5  # a plan's speed is a mean over at least this many steps
NOTE_CHANGE = 0.02  # say a new plan when it moves the end by at least 2 % (state.json keeps every plan)


def clock() -> float:
    """Wall seconds: the one clock a run's training time and its budget are read from (tests drive it by steps)."""
    return time.time()


def event_counts(
    steps: int, eval_interval, ckpt_interval: int, start: int = 0, final_save: bool = True
) -> Tuple[int, int]:
    """(evaluations, checkpoints) from `start` to `steps`, those due at `start` and the final ones included;
    `eval_interval`: steps, or a function of the run's length (TrainerConfig.eval_every)."""
    every = eval_interval(steps) if callable(eval_interval) else eval_interval
    since = max(start, 1) - 1
    evals = steps // every - since // every + (steps % every != 0)
    last = steps if final_save else steps - 1
    return evals, last // ckpt_interval - since // ckpt_interval + (final_save and steps % ckpt_interval != 0)


@dataclass(frozen=True)
class LoopCost:
    """Seconds a training loop spends per step, per evaluation, per checkpoint, and once (what is already spent)."""

    step_s: float
    eval_s: float
    save_s: float
    fixed_s: float

    def seconds(self, steps: int, eval_interval, ckpt_interval: int, start: int = 0, final_save: bool = True) -> float:
        evals, saves = event_counts(steps, eval_interval, ckpt_interval, start, final_save)
        return self.fixed_s + (steps - start) * self.step_s + evals * self.eval_s + saves * self.save_s

    def most_steps_within(
        self, budget_s: float, eval_interval, ckpt_interval: int, start: int = 0, final_save: bool = True
    ) -> int:
        """The most steps whose loop fits `budget_s`; at least `start` (a loop past its budget ends where it is)."""
        lo, hi = start, max(start + 1, start + int(2 * budget_s / max(self.step_s, 1e-9)) + 1)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (
                (mid, hi)
                if self.seconds(mid, eval_interval, ckpt_interval, start, final_save) <= budget_s
                else (lo, mid - 1)
            )
        return lo


# Where a speed window starts: the step, the clock, and the clock's paused and compiling seconds then.
Mark = collections.namedtuple("Mark", "step wall paused compile_s")


class TimeBudget:
    """Plans state.max_steps after a probe of WARMUP_STEPS + PROBE_STEPS steps, then at every evaluation, at least
    every REPLAN_SHARE of the budget and at its planned end; every plan goes into state.json (a resume follows it)."""

    def __init__(
        self,
        state,
        trainer,
        info: D.DistInfo,
        tokens_per_step: int,
        log,
        time_eval: Callable[[], float],
        time_save: Callable[[], float],
        cap: Optional[int] = None,
        limit: str = "",
    ):
        self.state, self.trainer, self.info, self.tokens_per_step, self.log = state, trainer, info, tokens_per_step, log
        self.minutes, self.cap, self.limit = trainer.time_budget, cap, limit
        self.time_eval, self.time_save = time_eval, time_save
        self.first_step, self.mark = state.step, None
        self.eval_s: Optional[float] = None
        self.save_s: Optional[float] = None
        timed = [plan for plan in state.plans if not plan.get("limit")]
        if timed:  # a resume: plan when the uninterrupted run would have, timing from here
            self.next_plan, self.last_plan = state.plans[-1].get("next_at", state.step), timed[-1]["at_step"]
            self.mark = self._mark(state.step)
        else:  # a probe first
            self.next_plan, self.last_plan = state.step + WARMUP_STEPS + PROBE_STEPS, None

    @staticmethod
    def start_plans(state, minutes: float, cap: Optional[int] = None, limit: str = "") -> None:
        """A new run's end before the clock plans it: the cap (named by `limit`), else UNPLANNED_END."""
        if not state.plans:
            state.max_steps = UNPLANNED_END
            if cap is not None:
                state.plan_budget(minutes, cap, 0.0, 0.0, state.step + WARMUP_STEPS + PROBE_STEPS, limit)

    def after_step(self, evaluating: bool) -> None:
        """After every step, before that step's evaluation (`evaluating`) and checkpoint."""
        state = self.state
        if self.mark is None:
            if state.step == self.first_step + WARMUP_STEPS:
                self.mark = self._mark(state.step)
            return
        # When to plan depends on steps alone (state.json carries them), so a resume plans where the run would have.
        at_eval = self.last_plan is not None and evaluating and state.step - self.last_plan >= MIN_WINDOW_STEPS
        # At the planned end, once more, from the steps since the last plan: an end planned under a load that has
        # since gone (or come) moves with the latest speed instead of ending the run early (or late).
        at_end = self.last_plan is not None and state.step >= state.max_steps
        if not (state.step >= self.next_plan or at_eval or at_end) or state.step == self.mark.step:
            return
        now, spent = self._mark(state.step), state.elapsed_s()
        costs = self._costs(now, spent)
        # The whole run within the budget: what is spent, then the steps after this one with their evaluations and
        # checkpoints (those due at this step included: the plan comes before them), the final ones included.
        decided = costs.most_steps_within(
            60.0 * self.minutes, self.trainer.eval_every, self.trainer.ckpt_interval, start=state.step
        )
        decided = min(decided, self.cap) if self.cap is not None else decided
        gap_s = min(REPLAN_SHARE * 60.0 * self.minutes, (decided - state.step) * costs.step_s / 2)
        next_plan = state.step + max(MIN_WINDOW_STEPS, math.ceil(gap_s / max(costs.step_s, 1e-9)))
        decided, later = D.agree_max([decided, -next_plan], self.info)  # every rank ends and plans at the same steps
        first, before = self.last_plan is None, state.max_steps
        self.mark, self.next_plan, self.last_plan = now, -later, state.step
        state.plan_budget(self.minutes, decided, costs.step_s, spent, self.next_plan)
        self.log.set_total(decided)
        if first:
            self.log.write(
                describe(self.minutes, decided, costs, self.tokens_per_step, self.first_step, self.cap, self.limit)
            )
        elif abs(decided - before) >= NOTE_CHANGE * before:
            self.log.write(
                f"time budget: re-planned at step {state.step}: {decided:,} steps (was {before:,}) at "
                f"{self.tokens_per_step / costs.step_s:,.0f} tok/s, {spent / 60:.2f} of {self.minutes:g} min spent"
            )

    def _costs(self, now: Mark, spent_s: float) -> LoopCost:
        """Seconds per step since the last mark (pauses and compiling out), per evaluation and checkpoint, spent."""
        last, steps = self.mark, max(now.step - self.mark.step, 1)
        paused = sum(now.paused[k][0] - last.paused.get(k, (0.0, 0))[0] for k in now.paused)
        step_s = max(now.wall - last.wall - paused - (now.compile_s - last.compile_s), 1e-6) / steps
        if self.eval_s is None:
            self.eval_s, self.save_s = self.time_eval(), self.time_save()
        for kind in ("eval", "save"):
            (seconds, count), (seen_s, seen) = now.paused.get(kind, (0.0, 0)), last.paused.get(kind, (0.0, 0))
            if count > seen:
                setattr(self, f"{kind}_s", (seconds - seen_s) / (count - seen))
        return LoopCost(step_s=step_s, eval_s=self.eval_s, save_s=self.save_s, fixed_s=spent_s)

    def _mark(self, step: int) -> Mark:
        if self.info.device.type == "cuda":  # note: a CPU-GPU sync point, once per plan
            torch.cuda.synchronize(self.info.device)
        return Mark(step, clock(), dict(self.log.clock.paused_by_kind), self.log.clock.compile_s())


def describe(
    minutes: float,
    max_steps: int,
    costs: LoopCost,
    tokens_per_step: int,
    first_step: int = 0,
    cap: Optional[int] = None,
    limit: str = "",
) -> str:
    """The first plan, as the run prints it."""
    speed = (
        f"{tokens_per_step / costs.step_s:,.0f} tok/s (step {costs.step_s * 1000:.0f} ms, eval {costs.eval_s:.1f} s, "
        f"checkpoint {costs.save_s:.1f} s, measured over steps {first_step + WARMUP_STEPS + 1}–"
        f"{first_step + WARMUP_STEPS + PROBE_STEPS})"
    )
    again = f"planned again at every evaluation and at least every {REPLAN_SHARE * minutes * 60:.0f} s"
    if cap is None:
        return f"time budget {minutes:g} min → {max_steps:,} steps at {speed}; {again}"
    ends = (
        f"{limit}: {max_steps:,} steps, inside the budget at {speed}"
        if max_steps == cap
        else f"{max_steps:,} steps at {speed}, before {limit} ({cap:,} steps)"
    )
    return f"time budget {minutes:g} min or {limit}, whichever comes first → {ends}; {again}"
