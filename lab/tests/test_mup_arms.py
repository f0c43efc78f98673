"""lab/mup/arms.py: each arm of the width-512 AdamW experiment answers "is the widest width worse than the
narrowest at some lr?" from its results.jsonl alone — paired over seeds, Holm over the arm's lrs, a diverged
wide run counted against it, and "not yet" until every lr has two seeds."""

import math

import pytest
from scipy import stats

from lab import mup_transfer as program
from lab.mup.arms import (
    BETTER,
    CANT_TELL,
    DIVERGED_WIDE,
    NARROWS,
    TOO_FEW,
    WIDENS,
    WORSE,
    arms_markdown,
    compare_arms,
    comparisons_markdown,
    judge_arm,
)
from lab.mup.transfer import DIVERGED, FINISHED, Cell, TransferSpec, open_experiment, record

ARM = TransferSpec(
    widths=(64, 512),
    lrs=(0.01, 0.02, 0.04),
    seeds=(0, 1, 2),
    optimizers=("adamw",),
    parametrizations=("mup",),
    overrides=("trainer.max_steps=1000",),
)


def write_arm(directory, losses: dict) -> None:
    """losses[(width, lr, seed)] = final loss (None: diverged; absent: not run yet)."""
    open_experiment(directory, ARM)
    for (width, lr, seed), loss in losses.items():
        record(
            directory,
            Cell("adamw", "mup", width, lr, seed),
            {"status": DIVERGED if loss is None else FINISHED, "val_loss": loss, "wall_s": 1.0},
        )


def full(wide_minus_narrow: dict) -> dict:
    """Every cell: the narrow width's loss 4.0 + seed noise, the wide width's that plus each lr's shift ± noise."""
    noise = {0: 0.00, 1: 0.03, 2: -0.02}
    losses = {}
    for lr in ARM.lrs:
        for seed in ARM.seeds:
            losses[(64, lr, seed)] = 4.0 + noise[seed]
            losses[(512, lr, seed)] = 4.0 + noise[seed] + wide_minus_narrow[lr] + 0.01 * (seed - 1)
    return losses


def test_a_wide_width_behind_at_one_lr_is_worse_there_and_the_arm_says_so(tmp_path):
    write_arm(tmp_path / "arm", full({0.01: 0.30, 0.02: 0.0, 0.04: -0.25}))
    arm = judge_arm(tmp_path / "arm")
    assert [r.call for r in arm.rows] == [WORSE, CANT_TELL, BETTER]
    worse = arm.rows[0]
    raw = stats.ttest_rel(worse.wide, worse.narrow).pvalue  # scipy's paired test of the same seeds
    assert worse.test.delta == pytest.approx(0.30) and worse.test.n == 3 and worse.p_holm >= raw
    assert worse.p_holm == pytest.approx(min(1.0, 3 * raw))  # Holm: the smallest of 3 p-values × 3
    assert arm.answer == "width 512 is worse than 64 at lr 0.01"
    text = arms_markdown([arm])
    assert "#### `arm`: width 512 is worse than 64 at lr 0.01" in text and "Settings: `trainer.max_steps=1000`." in text
    assert "| 0.01 | 3 | 4.0033 | 4.3033 | +0.300 [" in text


def test_an_arm_no_worse_anywhere_answers_yes_only_when_every_lr_has_two_seeds(tmp_path):
    losses = full({0.01: 0.0, 0.02: -0.2, 0.04: 0.01})
    write_arm(tmp_path / "done", losses)
    done = judge_arm(tmp_path / "done")
    top = max(r.test.high for r in done.rows)  # not "no worse": a test that rejects nothing shows no equivalence
    assert (
        done.answer
        == f"width 512 is not shown worse than 64 at any lr (3 seeds; upper 95 % bounds up to {top:+.2f} nats)"
    )
    assert top == pytest.approx(stats.ttest_rel(done.rows[2].wide, done.rows[2].narrow).confidence_interval(0.95).high)
    partial = {k: v for k, v in losses.items() if not (k[1] == 0.04 and k[2] > 0)}  # lr 0.04: seed 0 only
    write_arm(tmp_path / "partial", partial)
    arm = judge_arm(tmp_path / "partial")
    assert arm.rows[2].call == TOO_FEW and arm.answer == "not yet: 1 of 3 lrs have fewer than two seeds at both widths"
    assert "| 0.04 | 1 | 4.0000 | 4.0000 | +0.0000 (one seed) | | fewer than 2 seeds |" in arms_markdown([arm])


def test_a_run_that_diverged_only_at_the_wide_width_counts_against_it(tmp_path):
    losses = full({lr: 0.0 for lr in ARM.lrs})
    losses[(512, 0.04, 1)] = None
    write_arm(tmp_path / "arm", losses)
    arm = judge_arm(tmp_path / "arm")
    assert arm.rows[2].call == DIVERGED_WIDE and arm.answer == "width 512 is worse than 64 at lr 0.04"
    assert len(arm.rows[2].wide) == 2 and math.isfinite(arm.rows[2].p_holm)  # the two finite pairs still tested


def test_the_command_line_prints_each_arm_and_refuses_no_directory(tmp_path, capsys):
    write_arm(tmp_path / "control", full({lr: 0.0 for lr in ARM.lrs}))
    assert program.main(["--arms", str(tmp_path / "control")]) == 0
    assert (
        "#### `control`: width 512 is not shown worse than 64 at any lr (3 seeds; upper 95 % bounds up to +"
        in capsys.readouterr().out
    )
    with pytest.raises(ValueError, match=r"--dir DIR is needed \(or --arms DIR \.\.\.\)"):
        program.main([])


def test_an_arm_against_the_control_pairs_each_seeds_gap_and_holm_adjusts_over_lrs(tmp_path):
    """Per lr and seed the arm's L(512) − L(64) minus the control's; scipy's paired test on those gaps, Holm × 3."""
    control = full({0.01: 0.30, 0.02: 0.10, 0.04: 0.0})
    arm = full({0.01: 0.0, 0.02: 0.10, 0.04: 0.2})
    for cell, noise in (((512, 0.01, 1), 0.02), ((512, 0.02, 2), 0.05), ((512, 0.04, 0), -0.03)):
        arm[cell] += noise  # the seeds' gaps differ between the arms, so each lr is a real t-test
    write_arm(tmp_path / "control", control)
    write_arm(tmp_path / "arm", arm)
    comparison = compare_arms(tmp_path / "control", tmp_path / "arm")
    assert [r.call for r in comparison.rows] == [NARROWS, CANT_TELL, WIDENS]
    row = comparison.rows[0]
    gap = {
        name: [losses[(512, 0.01, s)] - losses[(64, 0.01, s)] for s in ARM.seeds]
        for name, losses in (("control", control), ("arm", arm))
    }
    assert row.control == pytest.approx(gap["control"]) and row.arm == pytest.approx(gap["arm"])
    assert row.test.delta == pytest.approx(-0.30 + 0.02 / 3) and row.test.n == 3
    tests = [stats.ttest_rel(r.arm, r.control).pvalue for r in comparison.rows]
    assert [r.p_holm for r in comparison.rows] == pytest.approx(_holm(tests))
    assert comparison.answer == "narrows the gap at lr 0.01; widens the gap at lr 0.04"
    text = comparisons_markdown([comparison])
    assert "#### `arm` against `control`: narrows the gap at lr 0.01; widens the gap at lr 0.04" in text
    assert "| 0.01 | 3 | +0.3000 | +0.0067 | -0.29" in text


def _holm(ps: list) -> list:
    """Holm's step-down adjustment written out: the i-th smallest × (m − i), kept monotone, capped at 1."""
    order, adjusted, running = sorted(range(len(ps)), key=ps.__getitem__), [0.0] * len(ps), 0.0
    for i, k in enumerate(order):
        running = max(running, min(1.0, ps[k] * (len(ps) - i)))
        adjusted[k] = running
    return adjusted


def test_a_seed_with_a_diverged_run_in_either_arm_is_left_out_and_counted(tmp_path):
    control, arm = full({lr: 0.0 for lr in ARM.lrs}), full({lr: 0.0 for lr in ARM.lrs})
    arm[(512, 0.04, 0)] = None
    control[(64, 0.01, 1)] = None
    del arm[(64, 0.02, 2)], arm[(64, 0.02, 1)]  # lr 0.02: one seed finished both widths in the arm
    write_arm(tmp_path / "control", control)
    write_arm(tmp_path / "arm", arm)
    rows = compare_arms(tmp_path / "control", tmp_path / "arm").rows
    assert [(len(r.arm), r.left_out, r.call) for r in rows] == [(2, 1, CANT_TELL), (1, 0, TOO_FEW), (2, 1, CANT_TELL)]
    text = comparisons_markdown([compare_arms(tmp_path / "control", tmp_path / "arm")])
    assert "| 0.04 | 2 (1 diverged, left out) |" in text and "(one seed) | | fewer than 2 seeds |" in text
    assert (
        compare_arms(tmp_path / "control", tmp_path / "arm").answer
        == "not yet: 1 of 3 lrs have fewer than two seeds in both arms"
    )


def test_arms_of_different_grids_are_refused_and_the_command_compares_each_arm_to_the_first(tmp_path, capsys):
    write_arm(tmp_path / "control", full({lr: 0.0 for lr in ARM.lrs}))
    write_arm(tmp_path / "arm", full({lr: 0.0 for lr in ARM.lrs}))
    other = TransferSpec(
        widths=(64, 256), lrs=ARM.lrs, seeds=ARM.seeds, optimizers=("adamw",), parametrizations=("mup",)
    )
    open_experiment(tmp_path / "other", other)
    with pytest.raises(ValueError, match="not arms of one experiment"):
        compare_arms(tmp_path / "control", tmp_path / "other")
    with pytest.raises(ValueError, match=r"missing is not an arm's directory \(no spec.json\)"):
        program.main(["--arms", str(tmp_path / "control"), str(tmp_path / "missing")])
    assert not (tmp_path / "missing").exists()  # nothing made where nothing was
    partial = full({lr: 0.1 for lr in ARM.lrs})
    del partial[(512, 0.04, 1)], partial[(512, 0.04, 2)]  # one seed at lr 0.04: a hollow marker
    write_arm(tmp_path / "partial", partial)
    figure = tmp_path / "arms.png"
    arms = [str(tmp_path / name) for name in ("control", "arm", "partial")]
    assert program.main(["--arms", *arms, "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert (
        "#### `control`: width 512" in out
        and "#### `arm` against `control`: no lr where it is shown to move the gap" in out
    )
    assert (
        "#### `partial` against `control`: widens the gap at lr 0.01, 0.02; not yet: 1 of 3 lrs have fewer "
        "than two seeds in both arms" in out
    )
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="--figure and --factorial go with --arms"):
        program.main(["--dir", str(tmp_path / "control"), "--figure", str(figure)])


def test_the_comparison_counts_the_narrow_runs_that_end_bit_for_bit_at_the_controls_loss(tmp_path):
    """An arm whose change is the identity at the narrow width reproduces the control's narrow runs exactly; one
    that does not (another machine, another kernel) shows up as a count below the total."""
    control = full({lr: 0.0 for lr in ARM.lrs})
    arm = dict(control)
    arm[(64, 0.02, 1)] += 1e-12  # one narrow run off in the last digits
    arm[(64, 0.04, 2)] = None  # a diverged narrow run is not counted
    del arm[(64, 0.01, 0)]  # nor one not run yet
    write_arm(tmp_path / "control", control)
    write_arm(tmp_path / "arm", arm)
    comparison = compare_arms(tmp_path / "control", tmp_path / "arm")
    assert comparison.same_narrow == (6, 7)
    assert (
        "At the narrow width 64, 6 of the 7 runs both finished end at the control's loss to the last digit."
        in comparisons_markdown([comparison])
    )
