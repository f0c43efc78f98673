"""training/budget.py's LoopCost, the one cost model: the time budget's plans, the speedrun's calibration and the
studies' cost plans all count a loop's steps, evaluations and checkpoints, and read throughput, this way."""

import pytest

from analysis.runs import steady_tokens_per_s
from training.budget import LoopCost, event_counts


def events_between(first: int, last: int, interval: int) -> int:
    """Multiples of `interval` in (first, last]: the reference the counts below are checked against."""
    return sum(1 for n in range(first + 1, last + 1) if n % interval == 0)


def test_the_most_steps_that_fit_the_budget_with_their_evals_and_checkpoints():
    costs = LoopCost(step_s=1.0, eval_s=10.0, save_s=5.0, fixed_s=20.0)
    # Spent 20 s by step 13; evals every 100, checkpoints every 50, each run also ends with both.
    n = costs.most_steps_within(600.0, eval_interval=100, ckpt_interval=50, start=13)

    def total(m):
        evals = events_between(13, m, 100) + (m % 100 != 0)
        saves = events_between(13, m, 50) + (m % 50 != 0)
        return 20 + (m - 13) + 10 * evals + 5 * saves

    assert total(n) <= 600 < total(n + 1) and costs.seconds(n, 100, 50, start=13) == total(n)
    assert n == 13 + (600 - 20) - 10 * 5 - 5 * 10  # 500 steps later: 5 evals, 10 checkpoints


def test_a_plan_made_at_an_evaluation_step_counts_that_evaluation_still_to_come():
    # At step 100 (an eval and a checkpoint are due after the plan): 100 s left, steps of 1 s, eval 10 s, save 5 s.
    n = LoopCost(1.0, 10.0, 5.0, fixed_s=100.0).most_steps_within(200.0, 100, 100, start=100)
    assert n == 100 + 100 - 2 * (10 + 5)  # the evaluation and checkpoint at 100, and the final ones at n


def test_a_probe_that_used_up_the_budget_ends_the_run_where_it_is():
    assert LoopCost(1.0, 1.0, 1.0, fixed_s=30.0).most_steps_within(10.0, 100, 100, start=13) == 13
    assert LoopCost(1.0, 1.0, 1.0, fixed_s=30.0).most_steps_within(10.0, 100, 100) == 0  # from the start: none


def test_the_seconds_from_a_plan_count_only_the_events_after_it():
    # From step 150 to 250, steps of 1 s: evaluations (10 s) at 200 and 250, checkpoints (5 s) at 200 and the final one.
    cost = LoopCost(step_s=1.0, eval_s=10.0, save_s=5.0, fixed_s=0.0)
    assert cost.seconds(250, 100, 100, start=150) == 100 + 2 * 10 + 2 * 5
    assert cost.seconds(250, 100, 100, start=150, final_save=False) == 100 + 2 * 10 + 1 * 5


@pytest.mark.parametrize(
    "steps, eval_interval, ckpt_interval, final_save, counts",
    [
        (100, 25, 40, True, (4, 3)),  # evals at 25, 50, 75, 100; saves at 40, 80 and the final one at 100
        (100, 25, 40, False, (4, 2)),  # the speedrun's loop clock stops before the final save
        (80, 25, 40, False, (4, 1)),  # a periodic save due at the last step is the final one: not counted
        (81, 25, 40, False, (4, 2)),  # without the final save, the one due at step 80 still counts
        (80, 25, 40, True, (4, 2)),  # the final save is the periodic one due at the last step: once
        (1, 25, 40, True, (1, 1)),
        (5, 1, 1, True, (5, 5)),  # every step: its first step's events too
    ],
)
def test_a_run_from_the_start_makes_each_event_once(steps, eval_interval, ckpt_interval, final_save, counts):
    assert event_counts(steps, eval_interval, ckpt_interval, final_save=final_save) == counts
    if final_save:  # the default: a run ends with its checkpoint
        assert event_counts(steps, eval_interval, ckpt_interval) == counts


@pytest.mark.parametrize("start", [1, 2, 29, 30, 31, 80, 90])
@pytest.mark.parametrize("final_save", [True, False])
def test_a_plan_made_mid_run_counts_the_events_still_to_come(start, final_save):
    """From a plan at `start` (its own step's events still due) to step 90; evaluations every 90 // 3 steps, given as
    a function of the run's length as TrainerConfig.eval_every is, checkpoints every 40."""
    steps, ckpt_interval = 90, 40
    evals = events_between(start - 1, steps, 30) + (steps % 30 != 0)
    last = steps if final_save else steps - 1
    saves = events_between(start - 1, last, ckpt_interval) + (final_save and steps % ckpt_interval != 0)
    assert event_counts(steps, lambda n: n // 3, ckpt_interval, start, final_save) == (evals, saves)


def test_seconds_at_a_throughput():
    cost = LoopCost(step_s=2048 / 1024.0, eval_s=3.0, save_s=0.0, fixed_s=5.0)
    assert cost.seconds(100, eval_interval=25, ckpt_interval=100) == 5.0 + 100 * 2.0 + 4 * 3.0  # saves cost 0


def test_throughput_is_the_median_without_the_warm_up_interval():
    rows = lambda rates: [{"kind": "train", "step": i, "tokens_per_s": r} for i, r in enumerate(rates)]
    assert steady_tokens_per_s(rows([10.0, 1000.0, 1100.0, 900.0])) == 1000.0
    assert steady_tokens_per_s(rows([10.0, 1000.0])) == 505.0  # too few to drop one
    assert steady_tokens_per_s(rows([]) + [{"kind": "eval", "step": 3, "val_loss": 1.0}]) is None
