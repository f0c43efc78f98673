"""lab/mup/factorial.py: the 2×2 of four arms — each seed's interaction (g_AB − g_B) − (g_A − g_control) and
main effects, a one-sample t-test over seeds (scipy), Holm over every lr of the grid, and a main effect at a lr
where the settings interact marked as the average it is."""

import shutil

import pytest
from scipy import stats

from lab import mup_transfer as program
from lab.mup.arms import CANT_TELL, NARROWS, TOO_FEW, WIDENS
from lab.mup.factorial import AVERAGE, INTERACTS, factorial, factorial_markdown
from lab.tests.test_mup_arms import ARM, _holm, full, write_arm

NAMES = ("control", "a", "b", "ab")


def write_four(tmp_path, shifts: dict, noise: dict = None) -> list:
    """shifts[name][lr] = that arm's L(512) − L(64) before noise; noise[(name, lr, seed)] added to its wide loss."""
    for name in NAMES:
        losses = full(shifts[name])
        for (arm, lr, seed), extra in (noise or {}).items():
            if arm == name:
                losses[(512, lr, seed)] += extra
        write_arm(tmp_path / name, losses)
    return [tmp_path / name for name in NAMES]


NOISE = {
    ("a", 0.01, 0): 0.02,
    ("b", 0.02, 1): -0.03,
    ("ab", 0.04, 2): 0.04,
    ("ab", 0.01, 1): -0.01,
    ("a", 0.04, 0): 0.015,
    ("b", 0.01, 2): 0.02,
}


def test_the_interaction_is_each_seeds_difference_of_differences_tested_by_scipy_and_holm_adjusted(tmp_path):
    # lr 0.01: A narrows the gap by 0.3 only when B is on (interaction -0.3); lr 0.04: A and B add up, no interaction
    shifts = {
        "control": {0.01: 0.3, 0.02: 0.3, 0.04: 0.3},
        "a": {0.01: 0.3, 0.02: 0.3, 0.04: 0.1},
        "b": {0.01: 0.3, 0.02: 0.3, 0.04: 0.2},
        "ab": {0.01: 0.0, 0.02: 0.3, 0.04: 0.0},
    }
    f = factorial(*write_four(tmp_path, shifts, NOISE))
    gaps = {
        name: {
            lr: [
                full(shifts[name])[(512, lr, s)] - full(shifts[name])[(64, lr, s)] + NOISE.get((name, lr, s), 0.0)
                for s in ARM.seeds
            ]
            for lr in ARM.lrs
        }
        for name in NAMES
    }
    per_seed = {lr: [(ab - b) - (a - c) for c, a, b, ab in zip(*(gaps[n][lr] for n in NAMES))] for lr in ARM.lrs}
    raw = [stats.ttest_1samp(per_seed[lr], 0.0).pvalue for lr in ARM.lrs]
    assert [r.p_holm for r in f.interaction.rows] == pytest.approx(_holm(raw))
    assert f.interaction.rows[0].test.delta == pytest.approx(sum(per_seed[0.01]) / 3)
    assert [r.call for r in f.interaction.rows][0] == INTERACTS and f.interaction.rows[2].call == CANT_TELL
    main_a = [((a + ab) - (c + b)) / 2 for c, a, b, ab in zip(*(gaps[n][0.04] for n in NAMES))]
    assert f.main_a.rows[2].test.delta == pytest.approx(sum(main_a) / 3)
    assert f.main_a.rows[2].call == NARROWS and f.main_b.rows[2].call == NARROWS
    assert f.main_a.rows[0].call.endswith(AVERAGE)  # the settings interact at 0.01: A's average effect is marked


def test_an_untested_lr_still_counts_in_the_holm_family(tmp_path):
    shifts = {name: {0.01: 0.3, 0.02: 0.3, 0.04: 0.3} for name in NAMES}
    shifts["ab"] = {0.01: 0.6, 0.02: 0.3, 0.04: 0.3}
    dirs = write_four(tmp_path, shifts, NOISE)
    losses = full(shifts["b"])
    for seed in (1, 2):
        del losses[(512, 0.02, seed)]  # lr 0.02: one seed in arm b, no test
    shutil.rmtree(tmp_path / "b")
    write_arm(tmp_path / "b", losses)
    f = factorial(*dirs)
    assert f.interaction.rows[1].call == TOO_FEW and f.interaction.rows[1].seeds == 1
    tested = [r for r in f.interaction.rows if r.test is not None]
    assert [r.p_holm for r in tested] == pytest.approx(_holm([r.test.p for r in tested] + [1.0])[:2])
    assert f.main_b.rows[0].call.startswith(WIDENS)


def test_the_table_shows_every_effect_with_its_interval_and_call(tmp_path):
    shifts = {name: {0.01: 0.3, 0.02: 0.3, 0.04: 0.3} for name in NAMES}
    text = factorial_markdown(factorial(*write_four(tmp_path, shifts, NOISE)))
    assert "#### 2×2: `a` × `b` (both: `ab`; neither: `control`)" in text
    assert "| lr | seeds | interaction | main effect of `a` | main effect of `b` |" in text
    assert text.count(": can't tell") == 9 and "| 0.01 | 3 | " in text


def test_the_command_line_reads_the_2x2_from_the_arms_and_refuses_names_it_does_not_have(tmp_path, capsys):
    shifts = {name: {0.01: 0.3, 0.02: 0.3, 0.04: 0.3} for name in NAMES}
    dirs = [str(d) for d in write_four(tmp_path, shifts, NOISE)]
    assert program.main(["--arms", *dirs, "--factorial", "a", "b", "ab"]) == 0
    assert "#### 2×2: `a` × `b`" in capsys.readouterr().out
    for names in (["a", "b", "control"], ["a", "a", "ab"], ["a", "b", "x"]):
        with pytest.raises(
            ValueError,
            match=r"--factorial .*: name three different arms of --arms after the "
            r"control \(a, b, ab\)",
        ):
            program.main(["--arms", *dirs, "--factorial", *names])
    with pytest.raises(ValueError, match="--figure and --factorial go with --arms"):
        program.main(["--dir", dirs[0], "--factorial", "a", "b", "ab"])
