"""studies/mup/arms.py: each arm of the width-512 AdamW experiment answers "is the widest width no worse than the
narrowest at every lr?" from its results.jsonl alone — paired over seeds, Holm over the arm's lrs, a diverged
wide run counted against it, and "not yet" until every lr has two seeds."""
import math

import pytest
from scipy import stats

from cli.mup import transfer as program
from studies.mup.arms import BETTER, CANT_TELL, DIVERGED_WIDE, TOO_FEW, WORSE, arms_markdown, judge_arm
from studies.mup.transfer import DIVERGED, FINISHED, Cell, TransferSpec, open_experiment, record

ARM = TransferSpec(widths=(64, 512), lrs=(0.01, 0.02, 0.04), seeds=(0, 1, 2), optimizers=("adamw",),
                   parametrizations=("mup",), overrides=("trainer.max_steps=1000",))


def write_arm(directory, losses: dict) -> None:
    """losses[(width, lr, seed)] = final loss (None: diverged; absent: not run yet)."""
    open_experiment(directory, ARM)
    for (width, lr, seed), loss in losses.items():
        record(directory, Cell("adamw", "mup", width, lr, seed), {"status": DIVERGED if loss is None else FINISHED,
                                                                 "val_loss": loss, "wall_s": 1.0})


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
    assert judge_arm(tmp_path / "done").answer == "width 512 is no worse than 64 at every lr"
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
    assert "#### `control`: width 512 is no worse than 64 at every lr" in capsys.readouterr().out
    with pytest.raises(ValueError, match=r"--dir DIR is needed \(or --arms DIR \.\.\.\)"):
        program.main([])
