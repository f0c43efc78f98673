"""training/budget.py: trainer.time_budget plans max_steps after a probe and again as the run goes, from the speed
measured since the last plan; the learning rate follows each new end without a jump; every plan is in
state.json, so a kill -9 and a resume end bitwise where the uninterrupted run ends.

The runs here read a step clock (tests/fault_injection.py's step_clock): each step costs the seconds the test
says, so a machine that slows down, or a start on a busy machine, is the same on every CPU and every run."""
import math
import signal

import pytest
import torch
from safetensors.torch import load_file

from tests.fault_injection import step_clock
from tests.train_helpers import read_metrics, run_dirs, run_faulty, train_in_process
from training.budget import MIN_WINDOW_STEPS, PROBE_STEPS, WARMUP_STEPS
from training.config import OptimConfig
from training.optim.schedule import lr_at, planned_lr_at, wsd_decay_start
from training.checkpoint.run_state import read_state


COSINE = OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=10)
WSD = OptimConfig(lr=1e-2, min_lr=1e-3, warmup_steps=10, schedule="wsd", decay_fraction=0.2)


@pytest.mark.parametrize("cfg", [COSINE, WSD])
def test_one_plan_is_exactly_the_schedule_of_a_run_told_that_end(cfg):
    assert all(planned_lr_at(s, cfg, [(23, 400)]) == lr_at(s, cfg, 400) for s in range(401))


@pytest.mark.parametrize("cfg", [COSINE, WSD])
@pytest.mark.parametrize("later", [50, 700])  # the machine slowed down (50 more steps) / sped up (700 more)
def test_a_new_end_moves_the_schedule_without_a_jump_and_it_still_ends_at_min_lr(cfg, later):
    at = 340 if cfg is WSD else 200  # inside WSD's decay (it starts at 320 of 400): the end matters there
    ends, new_end = [(23, 400), (at, at + later)], at + later
    before = [lr_at(s, cfg, 400) for s in range(at + 1)]
    after = [planned_lr_at(s, cfg, ends) for s in range(new_end + 1)]
    assert after[:at + 1] == before  # up to the plan, the curve is the one already trained
    pace = (400 - at) / later  # the rest of the schedule over the steps that now remain
    w = cfg.warmup_steps  # past the warmup's rise
    biggest = max(abs(a - b) for a, b in zip(after[w:], after[w + 1:]))
    plain = max(abs(lr_at(s, cfg, 400) - lr_at(s + 1, cfg, 400)) for s in range(w, 400))
    assert biggest <= 1.01 * max(pace, 1) * plain  # a new pace, never a jump
    # Simply stretching the curve to the new end would jump there, by several of the new curve's steps:
    assert abs(lr_at(at, cfg, new_end) - before[at]) > 3 * abs(after[at + 1] - after[at])
    assert after[-1] == pytest.approx(cfg.min_lr) and all(a >= cfg.min_lr - 1e-12 for a in after)
    assert all(a >= b - 1e-15 for a, b in zip(after[w:], after[w + 1:]))  # it only decays


def test_where_nothing_depended_on_the_end_a_new_end_is_taken_as_is():
    # Inside the warmup, any schedule; in WSD's stable phase (under the old end and the new), WSD.
    for cfg, at in ((COSINE, 8), (WSD, 8), (WSD, 200)):
        assert 200 < wsd_decay_start(WSD, 400)
        ends = [(3, 400), (at, 700)]
        assert all(planned_lr_at(s, cfg, ends) == lr_at(s, cfg, 700) for s in range(701)), (cfg.schedule, at)


BUDGET_ARGS = ["trainer.time_budget=0.05", "trainer.eval_interval=40", "trainer.ckpt_interval=1000",
               "trainer.log_interval=1", "trainer.sample_tokens=0", "trainer.activation_rms=false"]


def budget_run(tmp_path, monkeypatch, tiny_data_cache, segments, *extra):
    step_clock(segments, monkeypatch.setattr)
    return train_in_process(tmp_path / "run", *BUDGET_ARGS, *extra, cache_dir=tiny_data_cache)


def test_a_machine_that_slows_down_mid_run_still_ends_within_5_percent_of_the_budget(tmp_path, monkeypatch,
                                                                                    tiny_data_cache, capsys):
    """3 s of budget; steps take 20 ms, then 60 ms from step 60 on (another process took the cores). One plan
    would have ended at ~145 steps after ~5.5 s; the plans follow the slow-down and end within ±5 %."""
    outcome = budget_run(tmp_path, monkeypatch, tiny_data_cache, [[0, 0.02], [60, 0.06]])
    state = outcome.state
    assert abs(state.elapsed_s() / 3.0 - 1) <= 0.05, state.elapsed_s()
    plans = read_state(outcome.checkpoint)["budget"]["plans"]
    assert plans == state.plans and len(plans) >= 3
    assert plans[0]["at_step"] == WARMUP_STEPS + PROBE_STEPS and plans[0]["max_steps"] >= 140
    assert plans[-1]["max_steps"] == state.step < plans[0]["max_steps"]
    assert all(b["at_step"] - a["at_step"] >= MIN_WINDOW_STEPS for a, b in zip(plans, plans[1:]))
    out = capsys.readouterr().out
    assert "time budget 0.05 min → " in out and "time budget: re-planned at step " in out
    from training.report import summary
    took = state.elapsed_s()
    assert (f"time budget 0.05 min: the training loop took {took / 60:.2f} min ({took / 3 - 1:+.1%}), {len(plans)} plans "
            "(state.json)") in summary(outcome, tmp_path / "run", torch.device("cpu"))
    lrs = [row["lr"] for row in read_metrics(tmp_path / "run") if row["kind"] == "train"]
    after_warmup = lrs[5:]  # debug=tiny's AdamW warms up over 5 steps; the probe and every plan come after
    assert max(abs(a - b) for a, b in zip(after_warmup, after_warmup[1:])) < 0.1 * max(lrs)  # no jump at any plan
    assert after_warmup[:18] == pytest.approx([max(lrs)] * 18, rel=1e-6)  # before the first plan: the peak


def test_a_busy_start_whose_probe_is_badly_wrong_recovers(tmp_path, monkeypatch, tiny_data_cache):
    """The probe runs at 0.1 s a step (a busy start, as the one that planned 37 steps for 10 minutes), then the
    machine is free (20 ms a step): the run plans again, trains 2.5× the first plan's steps and still ends within
    ±5 % of the budget."""
    outcome = budget_run(tmp_path, monkeypatch, tiny_data_cache, [[0, 0.1], [WARMUP_STEPS + PROBE_STEPS, 0.02]],
                         "trainer.time_budget=0.1")
    first = outcome.state.plans[0]["max_steps"]
    assert first < 70 and outcome.state.step > 2.5 * first
    assert abs(outcome.state.elapsed_s() / 6.0 - 1) <= 0.05, outcome.state.elapsed_s()


CLOCK = {"step_clock": [[0, 0.02], [50, 0.05]]}


@pytest.mark.serial
def test_kill_9_after_several_plans_and_a_resume_end_bitwise_where_the_uninterrupted_run_ends(tmp_path,
                                                                                              tiny_data_cache):
    """Killed after step 72 (a checkpoint at 70, after plans at 23, 40 and later); the resume reads the plans from
    state.json and plans on: the same plans, the same final weights and losses as the run never killed."""
    args = [*BUDGET_ARGS, "trainer.ckpt_interval=35", "model.dropout=0.1"]
    killed = run_faulty(tmp_path / "a", {**CLOCK, "signal_at_step": [72, int(signal.SIGKILL)]}, *args,
                        cache_dir=tiny_data_cache, check=False)
    assert killed.returncode == -signal.SIGKILL
    (run,) = run_dirs(tmp_path / "a")
    saved = read_state(run / "checkpoints" / "step_0000070")["budget"]
    assert len(saved["plans"]) >= 2 and saved["plans"][0]["at_step"] == WARMUP_STEPS + PROBE_STEPS
    resumed = run_faulty(tmp_path / "a", CLOCK, *args, f"resume={run}", cache_dir=tiny_data_cache)
    assert f"steps 70→{saved['max_steps']} (planned by trainer.time_budget=0.05 min, {len(saved['plans'])} plans" \
        in resumed.stdout
    run_faulty(tmp_path / "b", CLOCK, *args, cache_dir=tiny_data_cache)
    (other,) = run_dirs(tmp_path / "b")
    ends = [read_state(max((r / "checkpoints").glob("step_*")))["budget"] for r in (run, other)]
    assert ends[0]["plans"] == ends[1]["plans"] and ends[0]["max_steps"] == ends[1]["max_steps"]
    final = f"step_{ends[0]['max_steps']:07d}"
    wa, wb = (load_file(r / "checkpoints" / final / "model.safetensors") for r in (run, other))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    losses = [{r["step"]: r["loss"] for r in read_metrics(r) if r["kind"] == "train"} for r in (run, other)]
    assert losses[0] == losses[1] and not math.isnan(losses[0][70])


def test_a_steady_machine_plans_exactly_the_steps_its_budget_holds(tmp_path, monkeypatch, tiny_data_cache):
    """The arithmetic pinned by hand: 21 ms a step, evaluations and checkpoints free, 3 s of budget. The probe
    measures steps 4–23 (20 steps over 0.42 s: 0.021 s a step — an off-by-one in the divisor would say 0.0221);
    at step 23, 0.483 s are spent, so 2.517 s hold 119 more whole steps (119.86): the run ends at step 142, after
    2.982 s (the off-by-one would end at 136)."""
    outcome = budget_run(tmp_path, monkeypatch, tiny_data_cache, [[0, 0.021]], "trainer.eval_interval=1000")
    first = outcome.state.plans[0]
    assert (first["at_step"], first["step_s"], first["spent_s"]) == (WARMUP_STEPS + PROBE_STEPS, 0.021, 0.483)
    assert first["max_steps"] == 142 and outcome.state.step == 142
    assert outcome.state.elapsed_s() == pytest.approx(142 * 0.021)
