"""trainer.time_budget: a run's length set by the clock, re-planned as the machine's speed changes.

Early on — inside the warmup, where the learning rate does not yet depend on the run's end — the run times a
few training steps, one evaluation's batches and one checkpoint, and plans max_steps to fit. A plan made
once cannot follow a machine whose speed changes (a 2-core machine's speed moved 2-3× with its neighbours'
load; one busy start planned 37 steps for 10 minutes), so the run plans again at every evaluation and at
least every REPLAN_SHARE of the budget — more often as the end nears — each time from the speed measured
since the last plan. The schedule follows each new end without a jump in the learning rate
(training/optim/schedule.py), and every plan goes into state.json, so a resume continues the same curve.

What the budget covers: the training loop from its first step to its final checkpoint — compiling,
evaluations, samples and checkpoints included; interpreter start-up and data preparation are not.

The budget is an upper bound: with trainer.max_epochs (the default's passes over the data) or trainer.max_steps
set too, every plan is at most their end (`cap`), so a corpus used up before the time is stops there, its
schedule decayed, instead of spending the rest of the budget on passes that overfit it. That end is known at the
start: it is the run's first plan, at step 0, and the clock's plans may only shorten it.
"""
import math
from dataclasses import dataclass
from typing import Optional

from training.checkpoint import run_state
from training.checkpoint.run_state import UNPLANNED_END
from training.runtime.loop_cost import LoopCost
from training.runtime import distributed as D

WARMUP_STEPS = 3  # compiling happens at the first step; the next two settle the caches
PROBE_STEPS = 20  # the first plan's speed: a mean over this many steps
REPLAN_SHARE = 0.05  # plan again at least every 5 % of the budget (30 s of a 10-minute run)
MIN_WINDOW_STEPS = 5  # a plan's speed is a mean over at least this many steps
NOTE_CHANGE = 0.02  # say a new plan when it moves the end by at least 2 % (state.json keeps every plan)


@dataclass
class Mark:
    """Where a speed window starts: the step, the clock, and the clock's paused and compiling seconds then."""
    step: int
    wall: float
    paused: dict
    compile_s: float


class TimeBudget:
    """Plans state.max_steps after a probe (WARMUP_STEPS + PROBE_STEPS steps after the start or a resume),
    then again at every evaluation and whenever the window it planned for has passed."""

    def __init__(self, ctx, log, validator, checkpointer, cap=None, limit=""):
        """ctx: the run's RunContext (its state is planned: start_plans first); log, validator, checkpointer: the
        parts it times; cap: the end trainer.max_steps / max_epochs set (None: the budget alone), `limit` names it."""
        state = ctx.state
        self.minutes = ctx.cfg.trainer.time_budget
        self.cap, self.limit = cap, limit
        self.budget_s, self.device, self.info, self.state = 60.0 * self.minutes, ctx.info.device, ctx.info, state
        self.tokens_per_step, self.log, self.validator, self.checkpointer = ctx.tokens_per_step, log, validator, checkpointer
        self.first_step = state.step  # 0, or where a resume starts
        self.mark: Optional[Mark] = None
        self.eval_s: Optional[float] = None
        self.save_s: Optional[float] = None
        timed = [plan for plan in state.plans if not plan.get("limit")]
        if timed:  # a resume: plan when the uninterrupted run would have, timing from here
            self.next_plan, self.last_plan = state.plans[-1].get("next_at", state.step), timed[-1]["at_step"]
            self.mark = self._mark(state.step, log)
        else:  # a probe first
            self.next_plan, self.last_plan = state.step + WARMUP_STEPS + PROBE_STEPS, None

    @staticmethod
    def start_plans(state, minutes: float, cap=None, limit: str = "") -> None:
        """A new run's end before the clock plans it: the cap when there is one (its first plan, at this step, named
        by `limit`), else an end far away (UNPLANNED_END). A resume's plans go on as they are."""
        if state.plans:
            return
        state.max_steps = UNPLANNED_END
        if cap is not None:
            state.plan_budget(minutes, cap, 0.0, 0.0, state.step + WARMUP_STEPS + PROBE_STEPS, limit)

    def after_step(self) -> None:
        """The loop calls this after every step (before that step's evaluation and checkpoint)."""
        state, validator, log, info, tokens_per_step = self.state, self.validator, self.log, self.info, self.tokens_per_step
        if self.mark is None:
            if state.step == self.first_step + WARMUP_STEPS:
                self.mark = self._mark(state.step, log)
            return
        # When to plan depends on steps alone (state.json carries them), so a resume plans where the run would have.
        at_eval = self.last_plan is not None and validator.should_validate(state.step) and \
            state.step - self.last_plan >= MIN_WINDOW_STEPS
        if not (state.step >= self.next_plan or at_eval) or state.step >= state.max_steps or state.step == self.mark.step:
            return
        now = self._mark(state.step, log)
        spent = state.elapsed_s()
        costs = self._costs(now, spent)
        trainer = validator.cfg.trainer
        # The whole run within the budget: what is spent, then the steps after this one, their evaluations and
        # checkpoints (those due at this step included: the plan comes before them), the final ones included.
        decided = costs.most_steps_within(self.budget_s, trainer.eval_every, trainer.ckpt_interval, start=state.step)
        if self.cap is not None:
            decided = min(decided, self.cap)
        gap_s = min(REPLAN_SHARE * self.budget_s, (decided - state.step) * costs.step_s / 2)
        next_plan = state.step + max(MIN_WINDOW_STEPS, math.ceil(gap_s / max(costs.step_s, 1e-9)))
        # Every rank ends at the same step and plans at the same steps (rank 0's clock may differ).
        decided, later = D.agree_max([decided, -next_plan], info)
        first = self.last_plan is None
        before = state.max_steps
        self.mark, self.next_plan, self.last_plan = now, -later, state.step
        state.plan_budget(self.minutes, decided, costs.step_s, spent, self.next_plan)
        log.set_total(decided)
        if first:
            log.write(describe(self.minutes, decided, costs, tokens_per_step, self.first_step, self.cap, self.limit))
        elif abs(decided - before) >= NOTE_CHANGE * before:
            log.write(f"time budget: re-planned at step {state.step}: {decided:,} steps (was {before:,}) at "
                      f"{tokens_per_step / costs.step_s:,.0f} tok/s, {spent / 60:.2f} of {self.minutes:g} min spent")

    def _costs(self, now: Mark, spent_s: float) -> LoopCost:
        """The rest of the run's costs: the step's seconds since the last mark (its evaluations, checkpoints and
        compiling taken out); an evaluation's and a checkpoint's from those the window saw, else measured once
        (the probe); and `spent_s`, the seconds already spent."""
        last, steps = self.mark, max(now.step - self.mark.step, 1)
        paused = sum(now.paused[k][0] - last.paused.get(k, (0.0, 0))[0] for k in now.paused)
        step_s = max(now.wall - last.wall - paused - (now.compile_s - last.compile_s), 1e-6) / steps
        if self.eval_s is None:
            self.eval_s, self.save_s = self.validator.time_one(), self.checkpointer.time_one()
        for kind in ("eval", "save"):
            seconds, count = now.paused.get(kind, (0.0, 0))
            seen_s, seen = last.paused.get(kind, (0.0, 0))
            if count > seen:
                setattr(self, f"{kind}_s", (seconds - seen_s) / (count - seen))
        return LoopCost(step_s=step_s, eval_s=self.eval_s, save_s=self.save_s, fixed_s=spent_s)

    def _mark(self, step: int, log) -> Mark:
        if self.device.type == "cuda":  # note: a CPU-GPU sync point, once per plan
            import torch
            torch.cuda.synchronize(self.device)
        return Mark(step, run_state.clock(), dict(log.clock.paused_by_kind), log.clock.compile_s())


def describe(minutes: float, max_steps: int, costs: LoopCost, tokens_per_step: int, first_step: int = 0,
             cap: Optional[int] = None, limit: str = "") -> str:
    """The first plan, as the run prints it."""
    speed = (f"{tokens_per_step / costs.step_s:,.0f} tok/s (step {costs.step_s * 1000:.0f} ms, eval {costs.eval_s:.1f} s, "
             f"checkpoint {costs.save_s:.1f} s, measured over steps {first_step + WARMUP_STEPS + 1}–"
             f"{first_step + WARMUP_STEPS + PROBE_STEPS})")
    again = f"planned again at every evaluation and at least every {REPLAN_SHARE * minutes * 60:.0f} s"
    if cap is None:
        return f"time budget {minutes:g} min → {max_steps:,} steps at {speed}; {again}"
    ends = (f"{limit}: {max_steps:,} steps, inside the budget at {speed}" if max_steps == cap else
            f"{max_steps:,} steps at {speed}, before {limit} ({cap:,} steps)")
    return f"time budget {minutes:g} min or {limit}, whichever comes first → {ends}; {again}"
