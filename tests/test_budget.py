"""training/budget.py: trainer.time_budget fixes max_steps once from measured costs, the schedule ends there,
and a resume (after kill -9) keeps that end — bitwise the run that was told the same max_steps."""
import json
import signal

import pytest
import torch
from safetensors.torch import load_file

from tests.train_helpers import read_metrics, run_dirs, run_faulty, run_train
from training.budget import PROBE_STEPS, WARMUP_STEPS, Costs, events_between, steps_for_budget


def test_events_between_counts_multiples_in_the_half_open_interval():
    assert events_between(0, 10, 5) == 2 and events_between(5, 10, 5) == 1 and events_between(6, 9, 5) == 0


def test_the_most_steps_that_fit_the_budget_with_their_evals_and_checkpoints():
    costs = Costs(step=1.0, eval=10.0, save=5.0)
    # Spent 20 s by step 13; evals every 100, checkpoints every 50, each run also ends with both.
    n = steps_for_budget(600.0, 20.0, 13, costs, eval_interval=100, ckpt_interval=50)
    def total(m):
        evals = events_between(13, m, 100) + (m % 100 != 0)
        saves = events_between(13, m, 50) + (m % 50 != 0)
        return 20 + (m - 13) + 10 * evals + 5 * saves
    assert total(n) <= 600 < total(n + 1)
    assert n == 13 + (600 - 20) - 10 * 5 - 5 * 10  # 500 steps later: 5 evals, 10 checkpoints


def test_a_probe_that_used_up_the_budget_ends_the_run_where_it_is():
    assert steps_for_budget(10.0, 30.0, 13, Costs(1.0, 1.0, 1.0), 100, 100) == 13


BUDGET = ["trainer.time_budget=0.1", "optim.warmup_steps=30", "trainer.eval_interval=100000", "trainer.log_interval=1",
          "trainer.precision=fp32", "model.dropout=0.1", "trainer.sample_tokens=0"]


@pytest.mark.serial
def test_a_budget_decides_the_steps_once_records_them_and_a_killed_run_resumes_to_the_same_end(tmp_path, tiny_data_cache):
    """kill -9 after step 26 (checkpoint at 25, past the decision at step 23); the resume reads the decision
    from state.json and finishes bitwise as the run that was given that many steps outright."""
    killed = run_faulty(tmp_path / "a", {"signal_at_step": [26, int(signal.SIGKILL)]}, *BUDGET,
                        "trainer.ckpt_interval=25", cache_dir=tiny_data_cache, check=False)
    assert killed.returncode == -signal.SIGKILL
    assert f"(time budget 0.1 min: the steps are decided after step {WARMUP_STEPS + PROBE_STEPS})" in killed.stdout
    assert "time budget 0.1 min → " in killed.stdout
    (run,) = run_dirs(tmp_path / "a")
    decided = json.loads((run / "checkpoints" / "step_0000025" / "state.json").read_text())["budget"]
    assert decided["minutes"] == 0.1 and decided["max_steps"] > 26
    n = decided["max_steps"]
    resumed = run_train(tmp_path / "a", f"resume={run}", cache_dir=tiny_data_cache)
    assert f"steps 25→{n} (decided by its time budget of 0.1 min)" in resumed.stdout
    assert max(r["step"] for r in read_metrics(run) if r["kind"] == "train") == n
    straight = [o for o in BUDGET if not o.startswith("trainer.time_budget")]
    run_train(tmp_path / "b", *straight, f"trainer.max_steps={n}", f"trainer.ckpt_interval={n}",
              cache_dir=tiny_data_cache)
    (other,) = run_dirs(tmp_path / "b")
    final = f"step_{n:07d}"
    wa, wb = (load_file(r / "checkpoints" / final / "model.safetensors") for r in (run, other))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    losses = [{r["step"]: r["loss"] for r in read_metrics(r) if r["kind"] == "train"} for r in (run, other)]
    assert losses[0] == losses[1]
