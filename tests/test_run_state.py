"""training/checkpoint.py's RunState and state.json, in process. A resume reads state.json through
`RunState.from_json`; the end-to-end resume tests run train.py, where a mutation testing tool cannot see a
change, so each field's way through the file is held here too."""

import dataclasses
import json
import math

import pytest

import training.checkpoint as R
from tests.checkpoint_fixture import checkpoint_of, fixture_dir
from training.checkpoint import FORMAT_VERSION, RunState, read_state
from training.optim import UNPLANNED_END

NOW = 1000.0


@pytest.fixture
def clock(monkeypatch):
    monkeypatch.setattr(R, "clock", lambda: NOW)


def everything_set() -> RunState:
    """A state with no field at its default (the clock aside): a field dropped on the way is seen."""
    state = RunState(
        step=40,
        tokens_seen=40_960,
        elapsed_before=12.5,
        skipped_steps=2,
        best_val_bpb=1.75,
        best_step=30,
        seed=3,
        sampling="epochs",
        world_size=2,
        max_steps=500,
        stop_at=45,
        evals_since_best=1,
        stopped_early=True,
        precision="bf16",
        machine="torch 2.13.0, cpu AVX2",
        data={"cache": "shakespeare-0123", "tokens": 9, "train_sha256": "a", "val_sha256": "b", "tokenizer_hash": "c"},
        data_changes=[{"at_step": 20, "before": {}, "after": {}}],
        started=NOW - 7.5,
    )
    state.plan_budget(5.0, 480, 0.1234567, 20.25, next_at=60)
    return state


def test_state_json_carries_every_field_a_resume_continues_with(clock, tmp_path):
    state = everything_set()
    (tmp_path / "state.json").write_text(json.dumps(state.to_json()))
    back = RunState.from_json(read_state(tmp_path))
    assert back == dataclasses.replace(state, elapsed_before=20.0, started=back.started)  # 12.5 before, 7.5 here
    assert back.plans == [{"at_step": 40, "max_steps": 480, "next_at": 60, "step_s": 0.123457, "spent_s": 20.25}]
    assert set(state.to_json()) == {f.name for f in dataclasses.fields(RunState)} - {"started"}  # field for field


def test_the_format_fixtures_state_json_reads_as_its_run_left_it():
    state = RunState.from_json(read_state(checkpoint_of(fixture_dir(FORMAT_VERSION))))
    assert (state.step, state.tokens_seen, state.seed, state.sampling, state.world_size) == (2, 512, 7, "epochs", 1)
    assert (state.best_step, state.evals_since_best, state.precision) == (2, 0, "fp32")
    assert state.max_steps == 3 and state.stop_at == 2  # the run's end, and where trainer.stop_at_step stopped it
    assert state.best_val_bpb == pytest.approx(7.5133, abs=1e-4) and not state.budget_decided


def test_a_new_best_is_strictly_lower_and_finite_and_resets_the_count_without_one():
    state = RunState(step=10)
    assert state.improves_best(2.0) and (state.best_val_bpb, state.best_step, state.evals_since_best) == (2.0, 10, 0)
    state.step = 20
    assert not state.improves_best(2.0)  # a tie is no improvement: checkpoints/best stays the earlier one
    assert not state.improves_best(2.5)
    assert not state.improves_best(math.nan)
    assert (state.best_val_bpb, state.best_step, state.evals_since_best) == (2.0, 10, 3)
    state.step = 30
    assert state.improves_best(1.5) and (state.best_val_bpb, state.best_step, state.evals_since_best) == (1.5, 30, 0)
    assert not RunState().improves_best(math.inf)


def test_a_budgets_plan_moves_the_end_and_is_recorded_at_its_step():
    state = RunState(step=25, max_steps=UNPLANNED_END)
    assert state.plans == [] and not state.budget_decided  # before the first plan
    state.plan_budget(10.0, 900, 0.5, 12.3456, next_at=100)
    assert (state.budget_minutes, state.max_steps, state.end) == (10.0, 900, 900)
    assert state.plans == [{"at_step": 25, "max_steps": 900, "next_at": 100, "step_s": 0.5, "spent_s": 12.346}]


def test_the_end_is_the_earlier_of_max_steps_and_a_stop_and_an_early_stop_ends_here():
    assert RunState(max_steps=100).end == 100
    assert RunState(max_steps=100, stop_at=40).end == 40
    assert RunState(max_steps=100, stop_at=400).end == 100
    state = RunState(step=33, max_steps=100)
    state.stopped_early, state.stop_at = True, state.step  # what the loop's early stop sets
    assert (state.stopped_early, state.stop_at, state.end) == (True, 33, 33)


def test_elapsed_counts_the_earlier_processes_and_this_ones_clock(clock):
    state = RunState(step=3, tokens_seen=300, elapsed_before=4.0, started=NOW - 1.0)
    assert state.elapsed_s() == 5.0


def test_a_fresh_runs_state_json_is_strict_json(clock, tmp_path):
    """No best yet is null, never `Infinity`, which strict JSON readers refuse."""
    text = json.dumps(RunState(step=1, tokens_seen=128, max_steps=10, started=NOW).to_json())
    fields = json.loads(text, parse_constant=lambda name: pytest.fail(f"{name} in state.json"))
    assert fields["best_val_bpb"] is None and fields["elapsed_before"] == 0.0
