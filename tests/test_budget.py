"""training/budget.py: trainer.time_budget plans max_steps after a probe and again as the run goes, from the speed
measured since the last plan; the learning rate follows each new end without a jump; every plan is in
state.json, so a kill -9 and a resume end bitwise where the uninterrupted run ends.

The runs here read a step clock (tests/fault_injection.py's step_clock): each step costs the seconds the test
says, so a machine that slows down, or a start on a busy machine, is the same on every CPU and every run."""

import math
import signal
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fault_injection import step_clock
from tests.train_helpers import read_metrics, run_dirs, run_faulty, train_in_process
from training.budget import MIN_WINDOW_STEPS, PROBE_STEPS, WARMUP_STEPS
from training.checkpoint import read_state
from training.config import OptimConfig
from training.optim import lr_at, planned_lr_at, wsd_decay_start

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
    assert after[: at + 1] == before  # up to the plan, the curve is the one already trained
    pace = (400 - at) / later  # the rest of the schedule over the steps that now remain
    w = cfg.warmup_steps  # past the warmup's rise
    biggest = max(abs(a - b) for a, b in zip(after[w:], after[w + 1 :]))
    plain = max(abs(lr_at(s, cfg, 400) - lr_at(s + 1, cfg, 400)) for s in range(w, 400))
    assert biggest <= 1.01 * max(pace, 1) * plain  # a new pace, never a jump
    # Simply stretching the curve to the new end would jump there, by several of the new curve's steps:
    assert abs(lr_at(at, cfg, new_end) - before[at]) > 3 * abs(after[at + 1] - after[at])
    assert after[-1] == pytest.approx(cfg.min_lr) and all(a >= cfg.min_lr - 1e-12 for a in after)
    assert all(a >= b - 1e-15 for a, b in zip(after[w:], after[w + 1 :]))  # it only decays


def test_where_nothing_depended_on_the_end_a_new_end_is_taken_as_is():
    # Inside the warmup, any schedule; in WSD's stable phase (under the old end and the new), WSD.
    for cfg, at in ((COSINE, 8), (WSD, 8), (WSD, 200)):
        assert 200 < wsd_decay_start(WSD, 400)
        ends = [(3, 400), (at, 700)]
        assert all(planned_lr_at(s, cfg, ends) == lr_at(s, cfg, 700) for s in range(701)), (cfg.schedule, at)


BUDGET_ARGS = [
    "trainer.time_budget=0.05",
    "trainer.eval_interval=40",
    "trainer.ckpt_interval=1000",
    "trainer.log_interval=1",
    "trainer.sample_tokens=0",
    "trainer.activation_rms=false",
]


def budget_run(tmp_path, monkeypatch, tiny_data_cache, segments, *extra):
    step_clock(segments, monkeypatch.setattr)
    return train_in_process(tmp_path / "run", *BUDGET_ARGS, *extra, cache_dir=tiny_data_cache)


def test_a_machine_that_slows_down_mid_run_still_ends_within_5_percent_of_the_budget(
    tmp_path, monkeypatch, tiny_data_cache, capsys
):
    """3 s of budget; steps take 20 ms, then 60 ms from step 60 on (another process took the cores). One plan
    would have ended at ~145 steps after ~5.5 s; the plans follow the slow-down and end within ±5 %."""
    outcome = budget_run(tmp_path, monkeypatch, tiny_data_cache, [[0, 0.02], [60, 0.06]])
    state = outcome.state
    assert abs(state.elapsed_s() / 3.0 - 1) <= 0.05, state.elapsed_s()
    plans = read_state(outcome.checkpoint)["plans"]
    assert plans == state.plans and len(plans) >= 3
    assert plans[0]["at_step"] == WARMUP_STEPS + PROBE_STEPS and plans[0]["max_steps"] >= 140
    assert plans[-1]["max_steps"] == state.step < plans[0]["max_steps"]
    # Plans are MIN_WINDOW_STEPS apart at least, but the one at the planned end, which revises it with the latest speed.
    assert all(
        b["at_step"] - a["at_step"] >= MIN_WINDOW_STEPS or b["at_step"] == a["max_steps"]
        for a, b in zip(plans, plans[1:])
    )
    out = capsys.readouterr().out
    assert "time budget 0.05 min → " in out and "time budget: re-planned at step " in out
    from training.log import summary

    took = state.elapsed_s()
    assert (
        f"time budget 0.05 min: the training loop took {took / 60:.2f} min ({took / 3 - 1:+.1%}), {len(plans)} plans "
        "(state.json)"
    ) in summary(outcome, tmp_path / "run", torch.device("cpu"))
    lrs = [row["lr"] for row in read_metrics(tmp_path / "run") if row["kind"] == "train"]
    after_warmup = lrs[5:]  # debug=tiny's AdamW warms up over 5 steps; the probe and every plan come after
    assert max(abs(a - b) for a, b in zip(after_warmup, after_warmup[1:])) < 0.1 * max(lrs)  # no jump at any plan
    assert after_warmup[:18] == pytest.approx([max(lrs)] * 18, rel=1e-6)  # before the first plan: the peak


def test_a_busy_start_whose_probe_is_badly_wrong_recovers(tmp_path, monkeypatch, tiny_data_cache):
    """The probe runs at 0.1 s a step (a busy start, as the one that planned 37 steps for 10 minutes), then the
    machine is free (20 ms a step): the run plans again, trains 2.5× the first plan's steps and still ends within
    ±5 % of the budget."""
    outcome = budget_run(
        tmp_path,
        monkeypatch,
        tiny_data_cache,
        [[0, 0.1], [WARMUP_STEPS + PROBE_STEPS, 0.02]],
        "trainer.time_budget=0.1",
    )
    first = outcome.state.plans[0]["max_steps"]
    assert first < 70 and outcome.state.step > 2.5 * first
    assert abs(outcome.state.elapsed_s() / 6.0 - 1) <= 0.05, outcome.state.elapsed_s()


@pytest.mark.parametrize("gone_at", [166, 168])
def test_a_load_that_goes_before_the_end_does_not_end_the_run_early(tmp_path, monkeypatch, tiny_data_cache, gone_at):
    """Issue 68: a load (steps 7.5× slower) from step 150 to just before the planned end. The last plans, made under
    the load, put the end at step 170; the run re-plans at that end from the steps since, so it trains on in the time
    the load left instead of ending at 0.91–0.96 of its budget as it did, and ends within ±5 %."""
    outcome = budget_run(
        tmp_path,
        monkeypatch,
        tiny_data_cache,
        [[0, 0.02], [150, 0.15], [gone_at, 0.02]],
        "trainer.time_budget=0.1",
    )
    under_load = [p for p in outcome.state.plans if p["step_s"] > 0.1]
    assert under_load and max(p["max_steps"] for p in under_load) <= 172 < outcome.state.step  # it trained past them
    assert abs(outcome.state.elapsed_s() / 6.0 - 1) <= 0.05, outcome.state.elapsed_s()


CLOCK = {"step_clock": [[0, 0.02], [50, 0.05]]}


@pytest.mark.serial
def test_kill_9_after_several_plans_and_a_resume_end_bitwise_where_the_uninterrupted_run_ends(
    tmp_path, tiny_data_cache
):
    """Killed after step 72 (a checkpoint at 70, after plans at 23, 40 and later); the resume reads the plans from
    state.json and plans on: the same plans, the same final weights and losses as the run never killed."""
    args = [*BUDGET_ARGS, "trainer.ckpt_interval=35", "model.dropout=0.1"]
    killed = run_faulty(
        tmp_path / "a",
        {**CLOCK, "signal_at_step": [72, int(signal.SIGKILL)]},
        *args,
        cache_dir=tiny_data_cache,
        check=False,
    )
    assert killed.returncode == -signal.SIGKILL
    (run,) = run_dirs(tmp_path / "a")
    saved = read_state(run / "checkpoints" / "step_0000070")
    assert len(saved["plans"]) >= 2 and saved["plans"][0]["at_step"] == WARMUP_STEPS + PROBE_STEPS
    resumed = run_faulty(tmp_path / "a", CLOCK, *args, f"resume={run}", cache_dir=tiny_data_cache)
    assert (
        f"steps 70→{saved['max_steps']} (planned by trainer.time_budget=0.05 min, {len(saved['plans'])} plans"
        in resumed.stdout
    )
    run_faulty(tmp_path / "b", CLOCK, *args, cache_dir=tiny_data_cache)
    (other,) = run_dirs(tmp_path / "b")
    ends = [read_state(max((r / "checkpoints").glob("step_*"))) for r in (run, other)]
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


# trainer.max_epochs under a time budget (the default: 10 minutes or 4 passes, whichever comes first), on a corpus
# of ~9 KB: ~3,000 training tokens at debug=tiny's 4 × 64 tokens a step, about 45 windows an epoch, so 4 passes
# are ~45 steps — far inside a budget of 0.5 min at 20 ms a step (1,500 steps).
PASSES_ARGS = [
    "trainer.time_budget=0.5",
    "trainer.max_epochs=4",
    "trainer.ckpt_interval=1000",
    "trainer.log_interval=1",
    "trainer.sample_tokens=0",
    "trainer.activation_rms=false",
    "data=local",
    "data.vocab_size=512",
    "trainer.eval_interval=null",
]


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    """(the corpus's overrides, its training tokens): the first 9,000 characters of a play, prepared once."""
    from data import prepare
    from data.sources import load_plays
    from tests.train_helpers import compose_train_config

    root = tmp_path_factory.mktemp("small_corpus")
    (root / "play.txt").write_text(load_plays()[0]["text"][:9000])
    args = [f"data.path={root / 'play.txt'}", f"data.cache_dir={root / 'cache'}"]
    cfg, _ = compose_train_config(["debug=tiny", *PASSES_ARGS, *args])
    return args, prepare(cfg.data, log=lambda *a: None).meta["train_tokens"]


def passes_run(run_dir, small_corpus, *extra, resume_ckpt=None):
    args, _ = small_corpus
    return train_in_process(
        run_dir, *PASSES_ARGS, *args, *extra, cache_dir=Path(args[1].split("=", 1)[1]), resume_ckpt=resume_ckpt
    )


def test_a_corpus_used_up_before_the_budget_stops_at_its_passes_with_the_schedule_decayed(
    tmp_path, monkeypatch, small_corpus
):
    from data import windows_per_epoch
    from training.log import summary

    step_clock([[0, 0.02]], monkeypatch.setattr)
    outcome = passes_run(tmp_path / "run", small_corpus)
    state, rows = outcome.state, read_metrics(tmp_path / "run")
    passes_end = math.ceil(4 * windows_per_epoch(small_corpus[1], 64) / 4)
    assert WARMUP_STEPS + PROBE_STEPS < passes_end < 100  # the budget's first plan comes before the passes end
    assert state.step == state.max_steps == passes_end and state.elapsed_s() < 0.2 * 30  # far inside its 30 s
    assert state.plans[0] == {
        "at_step": 0,
        "max_steps": passes_end,
        "next_at": WARMUP_STEPS + PROBE_STEPS,
        "step_s": 0.0,
        "spent_s": 0.0,
        "limit": "4 passes over every window (trainer.max_epochs=4)",
    }
    assert len(state.plans) > 1 and all(plan["max_steps"] == passes_end for plan in state.plans)  # never past it
    tiny_adamw = OptimConfig(lr=3e-3, min_lr=3e-4, warmup_steps=5)
    lrs = [row["lr"] for row in rows if row["kind"] == "train"]
    assert lrs == pytest.approx([lr_at(s, tiny_adamw, passes_end) for s in range(passes_end)], rel=1e-9)
    assert lrs[-1] < 1.01 * tiny_adamw.min_lr  # the schedule is at its end value where the data ends
    evals = [row["step"] for row in rows if row["kind"] == "eval"]
    assert len(evals) >= 10 and evals[-1] == passes_end  # sized to the run, and the end
    said = summary(outcome, tmp_path / "run", torch.device("cpu"))
    assert (
        f"stopped at 4 passes over every window (trainer.max_epochs=4), after {state.elapsed_s() / 60:.2f} of "
        "trainer.time_budget=0.5 min: more passes over the same data stop lowering the validation loss"
    ) in said


def test_a_budget_shorter_than_the_passes_plans_below_them_and_says_which_ends_it(
    tmp_path, monkeypatch, small_corpus, capsys
):
    """0.5 s a step: the budget (30 s) holds ~55 steps, fewer than 12 passes (~135 steps) — the budget ends the
    run, and its first plan says it comes before the passes."""
    step_clock([[0, 0.5]], monkeypatch.setattr)
    outcome = passes_run(tmp_path / "run", small_corpus, "trainer.max_epochs=12")
    state = outcome.state
    assert state.plans[0]["limit"] and state.step == state.plans[-1]["max_steps"] < state.plans[0]["max_steps"]
    assert abs(state.elapsed_s() / 30 - 1) <= 0.05 and outcome.limit == ""
    out = capsys.readouterr().out
    assert "time budget 0.5 min or 12 passes over every window (trainer.max_epochs=12), whichever comes first → " in out
    assert f", before 12 passes over every window (trainer.max_epochs=12) ({state.plans[0]['max_steps']} steps)" in out


def test_a_resume_across_the_passes_end_is_bitwise_the_run_never_stopped(tmp_path, monkeypatch, small_corpus):
    """Stopped at step 30 (after the budget's first plan at 23), resumed: it stops at the same end, with the same
    weights, losses and plans as the run never stopped."""
    step_clock([[0, 0.02]], monkeypatch.setattr)  # each run with a clock of its own, as each process has
    whole = passes_run(tmp_path / "whole", small_corpus)
    step_clock([[0, 0.02]], monkeypatch.setattr)
    part = passes_run(tmp_path / "part", small_corpus, "trainer.stop_at_step=30")
    assert part.state.step == 30 < whole.state.step
    step_clock([[0, 0.02]], monkeypatch.setattr)
    resumed = passes_run(tmp_path / "part", small_corpus, resume_ckpt=part.checkpoint)
    assert resumed.state.step == whole.state.step and resumed.state.plans == whole.state.plans
    wa, wb = (load_file(o.checkpoint / "model.safetensors") for o in (whole, resumed))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    losses = [
        {r["step"]: r["loss"] for r in read_metrics(d) if r["kind"] == "train"}
        for d in (tmp_path / "whole", tmp_path / "part")
    ]
    assert losses[0] == losses[1]
