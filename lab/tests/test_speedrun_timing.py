"""The speedrun's calibration (lab/speedrun/timing.py, spec.py): the arithmetic against a loop timed
by hand, the event counts against a simulated loop, a recipe calibrated from the reference's probe, and
the recipes' checks."""

import json

import pytest

from lab import speedrun as S

# ---- calibration arithmetic ---------------------------------------------------------------------------

# A probe of 40 steps (logs every 10, evals at 20 and 40, a save at 30) timed by hand: steady steps of
# 0.5 s, the first 10 steps 2 s slower (warm-up), 15 s compiling the training graph before step 1 and
# 3 s compiling the eval graph at the first eval, evals 3 s, a periodic save 1 s.
STEP, EVAL, SAVE, WARMUP, TRAIN_COMPILE, EVAL_COMPILE, TOKENS = 0.5, 3.0, 1.0, 2.0, 15.0, 3.0, 100


def hand_timed_probe():
    interval = {10: 10 * STEP + WARMUP, 20: 10 * STEP, 30: 10 * STEP, 40: 10 * STEP}
    t10 = TRAIN_COMPILE + interval[10]
    t20 = t10 + interval[20]
    t30 = t20 + EVAL_COMPILE + EVAL + interval[30]
    t40 = t30 + SAVE + interval[40]
    elapsed = {10: t10, 20: t20, 30: t30, 40: t40}
    compile_s = {
        10: TRAIN_COMPILE,
        20: TRAIN_COMPILE,
        30: TRAIN_COMPILE + EVAL_COMPILE,
        40: TRAIN_COMPILE + EVAL_COMPILE,
    }
    rows = [
        {
            "kind": "train",
            "step": s,
            "tokens_per_s": 10 * TOKENS / interval[s],
            "elapsed_s": elapsed[s],
            "compile_s": compile_s[s],
        }
        for s in (10, 20, 30, 40)
    ]
    rows.insert(2, {"kind": "eval", "step": 20, "val_bpb": 3.0})
    return rows, t40 + EVAL  # the final eval (with its best checkpoint) ends the loop clock


def test_probe_is_decomposed_into_the_costs_it_was_built_from():
    rows, loop_s = hand_timed_probe()
    t = S.timing_from_probe(rows, loop_s, 40, TOKENS, best_step=40)
    assert t.step_s == pytest.approx(STEP)
    assert t.eval_s == pytest.approx(EVAL)
    assert t.save_s == pytest.approx(SAVE)
    assert t.fixed_s == pytest.approx(TRAIN_COMPILE + EVAL_COMPILE + WARMUP)  # once per run, whatever its length
    assert t.tokens_per_s == pytest.approx(TOKENS / STEP)
    assert S.predict_loop_s(t, 40, 20, 30) == pytest.approx(loop_s)  # the model reproduces its own probe
    # 1000 steps, evals every 200 (5), saves every 400 before the last (2):
    expected = TRAIN_COMPILE + EVAL_COMPILE + WARMUP + 1000 * STEP + 5 * EVAL + 2 * SAVE
    assert S.predict_loop_s(t, 1000, 200, 400) == pytest.approx(expected)


def test_a_final_eval_without_a_new_best_checkpoint_still_counts_one_per_eval():
    rows, loop_s = hand_timed_probe()
    # The final eval did not improve, so no `best` checkpoint was written with it: it took EVAL - SAVE.
    t = S.timing_from_probe(rows, loop_s - SAVE, 40, TOKENS, best_step=20)
    assert t.eval_s == pytest.approx(EVAL)  # a typical eval (which does write one) is charged in full


def test_missing_probe_rows_are_an_error_naming_the_steps():
    rows, loop_s = hand_timed_probe()
    with pytest.raises(S.SpeedrunError, match="step.* 30"):
        S.timing_from_probe([r for r in rows if r["step"] != 30 or r["kind"] != "train"], loop_s, 40, TOKENS, 40)


@pytest.mark.parametrize(
    "steps, eval_interval, ckpt_interval",
    [(1, 5, 5), (7, 5, 3), (10, 5, 5), (400, 200, 400), (401, 200, 400), (999, 200, 400), (1000, 200, 400)],
)
def test_event_counts_match_the_loops_schedule(steps, eval_interval, ckpt_interval):
    """training/loop.py evaluates at every multiple of eval_interval and at the last step, saves at
    every multiple of ckpt_interval and at the last step (that one after the loop clock stops)."""
    evals = sum(1 for s in range(1, steps + 1) if s % eval_interval == 0 or s == steps)
    saves = sum(1 for s in range(1, steps + 1) if s % ckpt_interval == 0 and s != steps)
    assert S.n_evals(steps, eval_interval) == evals
    assert S.n_saves(steps, ckpt_interval) == saves


@pytest.mark.parametrize("budget", [50.0, 100.0, 600.0, 601.3])
def test_steps_for_budget_is_the_most_that_fit(budget):
    t = S.Timing(step_s=0.37, eval_s=2.9, save_s=0.6, fixed_s=41.0, compile_s=38.0, tokens_per_s=1.0, probe_loop_s=60.0)
    n = S.steps_for_budget(t, budget, eval_interval=50, ckpt_interval=75)
    assert S.predict_loop_s(t, n, 50, 75) <= budget < S.predict_loop_s(t, n + 1, 50, 75)


def test_a_costlier_step_gets_fewer_steps_from_the_same_probe():
    """step_cost scales the step time alone: compile, evals and checkpoints stay the reference's."""
    rows, loop_s = hand_timed_probe()
    t = S.timing_from_probe(rows, loop_s, 40, TOKENS, best_step=40)
    costly = S.scaled(t, 1.25)
    assert (costly.step_s, costly.tokens_per_s) == pytest.approx((1.25 * t.step_s, t.tokens_per_s / 1.25))
    assert (costly.fixed_s, costly.eval_s, costly.save_s) == (t.fixed_s, t.eval_s, t.save_s)
    mine, theirs = S.steps_for_budget(costly, 300.0, 200, 400), S.steps_for_budget(t, 300.0, 200, 400)
    assert mine < theirs and S.predict_loop_s(costly, mine, 200, 400) <= 300.0 < S.predict_loop_s(
        costly, mine + 1, 200, 400
    )


def test_a_step_cost_recipe_is_calibrated_from_the_references_probe_scaled(tmp_path):
    """No probe of its own: the reference's stored timing, the step time × the factor, the steps refit."""
    import argparse
    from dataclasses import asdict

    from lab.speedrun.campaign import ALWAYS, Campaign, calibrate

    rows, loop_s = hand_timed_probe()
    t = S.timing_from_probe(rows, loop_s, 40, TOKENS, best_step=40)
    spec = S.Spec(recipes={"ref": [], "muon": ["optim=muon"]}, reference="ref", budget_s=300.0, step_cost={"muon": 2.0})
    ref = {
        "overrides": [*ALWAYS],
        "budget_s": 300.0,
        "probe_steps": 40,
        "tokens_per_step": TOKENS,
        "eval_interval": 200,
        "ckpt_interval": 400,
        "timing": asdict(t),
        "max_steps": S.steps_for_budget(t, 300.0, 200, 400),
    }
    (tmp_path / "ref").mkdir()
    (tmp_path / "ref" / "calibration.json").write_text(json.dumps(ref))
    args = argparse.Namespace(only=None, dir=tmp_path, lock=None, redo_flagged=False)
    cal = calibrate(Campaign(args, spec), "muon")
    assert cal["max_steps"] == S.steps_for_budget(S.scaled(t, 2.0), 300.0, 200, 400) < ref["max_steps"]
    assert (cal["step_cost"], cal["steps_from"], cal["overrides"]) == (2.0, "ref", [*ALWAYS, "optim=muon"])
    assert not (tmp_path / "ref" / "probe").exists()  # nothing trained


def test_a_budget_shorter_than_compiling_is_an_error():
    t = S.Timing(step_s=0.5, eval_s=3, save_s=1, fixed_s=40, compile_s=38, tokens_per_s=1, probe_loop_s=60)
    with pytest.raises(S.SpeedrunError, match="raise --budget"):
        S.steps_for_budget(t, 30.0, 200, 400)


def test_runs_off_budget_or_slower_than_the_probe_are_flagged():
    assert S.run_flags(605.0, 600.0, 0.03, 1990.0, 2000.0) == []
    assert "+5.0% off" in S.run_flags(630.0, 600.0, 0.03, 2000.0, 2000.0)[0]
    assert "busy" in S.run_flags(600.0, 600.0, 0.03, 1500.0, 2000.0)[0]


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"recipes": {"a": []}, "reference": "b"}, "reference 'b'"),
        ({"recipes": {"a": ["trainer.max_steps=5"]}, "reference": "a"}, "set by the speedrun"),
        ({"recipes": {"a": ["seed=3"]}, "reference": "a"}, "set by the speedrun"),
        ({"recipes": {"a b": []}, "reference": "a b"}, "names a directory"),
        ({"recipes": {"a": []}, "reference": "a", "probe_steps": 10}, "multiple of 4"),
        ({"recipes": {"a": [], "b": []}, "reference": "a", "step_cost": {"c": 1}}, "step_cost: c not among"),
        ({"recipes": {"a": [], "b": []}, "reference": "a", "step_cost": {"a": 1}}, "the reference 'a' calibrates"),
        ({"recipes": {"a": [], "b": []}, "reference": "a", "step_cost": {"b": 0}}, "b: 0.0 must be > 0"),
    ],
)
def test_bad_recipes_are_refused_with_the_reason(fields, message):
    with pytest.raises(S.SpeedrunError, match=message):
        S.Spec(**fields)
