"""analysis/verdicts.py against published worked examples: Holm's step-down adjusted p-values, Schuirmann's
TOST on Student's sleep data; then the four verdicts and what a family's adjustment does to them."""

import math

import pytest
from scipy import stats

from lab.ablation.contrasts import table_cells
from lab.stats import BETTER, CANT_TELL, EQUIVALENT, WORSE, adjust, decide, judge, paired_tost

# Student's sleep data (R's `sleep`), as in test_stats.py: extra hours of sleep of 10 patients on two drugs.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]
# R: t.test(extra ~ group, data = sleep, paired = TRUE): t = -4.0621, df = 9 for group 1 − group 2 (Δ = -1.58),
# so the standard error of the mean difference is 1.58 / 4.0621.
SE = 1.58 / 4.0621


def test_holm_reproduces_the_textbook_example():
    # The Holm–Bonferroni method's worked example (Holm 1979's procedure, as in Wikipedia's "Holm–Bonferroni
    # method"): four hypotheses with p = 0.01, 0.04, 0.03, 0.005 at α = 0.05. Ordered 0.005, 0.01, 0.03, 0.04
    # against α/4, α/3, α/2, α: H4 and H1 are rejected, H3 (0.03 > 0.025) stops the procedure.
    # Adjusted p = running max of (m − k + 1)·p_(k): 4 × 0.005 = 0.02, 3 × 0.01 = 0.03, 2 × 0.03 = 0.06, max(0.04, 0.06).
    assert adjust([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # A second set by hand: multipliers 5, 4, 3, 2, 1 on the sorted p-values, then monotone.
    assert adjust([0.04, 0.001, 0.13, 0.011, 0.02]) == pytest.approx([0.08, 0.005, 0.13, 0.044, 0.06])


def test_holm_keeps_the_preregistered_family_size_when_a_test_is_missing():
    assert adjust([0.01, math.nan]) == pytest.approx([0.02, 1.0])  # not 0.01: the family had two contrasts
    assert adjust([0.3]) == pytest.approx([0.3]) and adjust([]) == []
    assert adjust([0.01, 0.04], "bonferroni") == pytest.approx([0.02, 0.08])  # the method is the spec's


def test_tost_reproduces_the_sleep_data_at_a_half_hour_margin():
    # TOST of group 1 − group 2 within ±0.5 h (the TOSTER vignette's t_TOST(extra ~ group, data = sleep,
    # paired = TRUE, eqb = 0.5)): lower bound t = (-1.58 + 0.5) / SE = -2.777, p = 0.989; upper bound
    # t = (-1.58 - 0.5) / SE = -5.348, p = 2.3e-4. Not equivalent: the difference is far outside ±0.5.
    tost = paired_tost(DRUG1, DRUG2, margin=0.5)
    assert tost.p_lower == pytest.approx(stats.t.sf((-1.58 + 0.5) / SE, 9), rel=1e-3)
    assert tost.p_lower == pytest.approx(0.989, abs=1e-3)
    assert tost.p_upper == pytest.approx(stats.t.cdf((-1.58 - 0.5) / SE, 9), rel=1e-3)
    assert tost.p_upper == pytest.approx(2.32e-4, rel=0.01)
    assert tost.p == tost.p_lower


def test_tost_shows_equivalence_at_a_wide_margin_and_agrees_with_the_90_percent_interval():
    # At ±2.5 h: lower t = (-1.58 + 2.5) / SE = 2.365, p = 0.021; upper t = -10.49, p ≈ 1e-6: equivalent at 5 %.
    # Schuirmann: TOST at α ⇔ the (1 − 2α) CI, -1.58 ± t(0.95, 9) · SE = [-2.293, -0.867], lies inside ±2.5.
    tost = paired_tost(DRUG1, DRUG2, margin=2.5)
    assert tost.p == pytest.approx(0.0211, abs=2e-4) and tost.p < 0.05
    assert (tost.low, tost.high) == (
        pytest.approx(-1.58 - 1.833113 * SE, abs=1e-3),
        pytest.approx(-1.58 + 1.833113 * SE, abs=1e-3),
    )
    for margin in (1.5, 2.0, 2.2, 2.3, 3.0):
        t = paired_tost(DRUG1, DRUG2, margin)
        assert (t.p < 0.05) == (-margin < t.low and t.high < margin), margin


def test_tost_without_spread_or_pairs():
    same = paired_tost([1.0, 2.0, 3.0], [1.004, 2.004, 3.004], margin=0.01)  # every seed 0.004 apart
    assert same.p == 0.0 and same.low == same.high == pytest.approx(-0.004)
    assert paired_tost([1.0, 2.0], [1.5, 2.5], margin=0.01).p == 1.0  # 0.5 apart in every seed: not within ±0.01
    assert paired_tost([1.0], [1.1], 0.01) is None


def family(**contrasts):
    """{name: (variant values, reference values)} from {name: per-seed differences} on a common reference."""
    reference = [2.0, 2.1, 1.9, 2.05, 1.95]
    return {
        name: ([r + d for r, d in zip(reference, diffs)], reference[: len(diffs)]) for name, diffs in contrasts.items()
    }


def test_the_four_verdicts():
    verdicts = judge(
        family(
            faster=[-0.05, -0.06, -0.04, -0.055, -0.045],  # better, beyond doubt
            slower=[0.05, 0.06, 0.04, 0.055, 0.045],  # worse
            same=[0.001, -0.001, 0.0005, -0.0005, 0.0],  # inside ±0.01, tightly: equivalent
            noisy=[0.03, -0.03, 0.02, -0.025, 0.004],
        ),  # neither shown: can't tell
        "primary, own LR",
        alpha=0.05,
        margin=0.01,
    )
    assert {k: v.outcome for k, v in verdicts.items()} == {
        "faster": BETTER,
        "slower": WORSE,
        "same": EQUIVALENT,
        "noisy": CANT_TELL,
    }
    assert all(v.family_size == 4 and v.family == "primary, own LR" for v in verdicts.values())
    assert verdicts["same"].sentence().startswith("equivalent within ±0.01 bpb: TOST ±0.01 bpb: Holm p")
    noisy = verdicts["noisy"]
    assert noisy.test.p > 0.05 and noisy.tost_adjusted > 0.05  # no difference shown, and no equivalence either
    assert noisy.sentence() == (
        "can't tell: Δ = -0.000 ± 0.033 bpb (95 % CI), Holm p = 1.00 (primary, own LR family "
        "of 4); TOST ±0.01 bpb: Holm p = 0.69, 5 paired seeds"
    )
    assert table_cells(verdicts["faster"])[-1] == "**better**"
    assert (
        judge(family(x=[0.05, 0.06, 0.04]), "f", 0.05, 0.01, "bonferroni")["x"]
        .sentence()
        .startswith("worse: Δ = +0.050 ± 0.025 bpb (95 % CI), Bonferroni p = 0.0")
    )
    assert "p = <" not in "".join(v.sentence() for v in verdicts.values())


def test_holm_turns_a_lone_significant_contrast_into_cant_tell_in_a_family():
    lone = family(gelu=[-0.02, -0.035, 0.0, -0.03, -0.015])
    alone = judge(lone, "alone", 0.05, 0.001)["gelu"]
    assert 0.0125 < alone.test.p < 0.05 and alone.outcome == BETTER
    crowd = judge(
        {
            **lone,
            **family(
                a=[0.1, -0.1, 0.05, -0.05, 0.0], b=[0.1, -0.1, 0.05, -0.05, 0.01], c=[0.1, -0.1, 0.05, -0.05, 0.02]
            ),
        },
        "primary",
        0.05,
        0.001,
    )["gelu"]
    assert crowd.test.p == alone.test.p and crowd.p_adjusted == pytest.approx(4 * alone.test.p)
    assert crowd.outcome == CANT_TELL


@pytest.mark.parametrize(
    "delta, p_adjusted, tost_adjusted, outcome",
    [
        (-0.1, 0.01, 0.9, BETTER),
        (0.1, 0.01, 0.9, WORSE),
        (0.001, 0.01, 0.01, WORSE),  # a real but tiny difference
        (0.001, 0.5, 0.01, EQUIVALENT),
        (0.001, 0.5, 0.2, CANT_TELL),
        (0.0, 0.05, 0.05, CANT_TELL),  # p = α is not < α
    ],
)
def test_decide_rules(delta, p_adjusted, tost_adjusted, outcome):
    from analysis.stats import TTest

    assert decide(TTest(delta, delta - 1, delta + 1, 0.0, 5), p_adjusted, tost_adjusted, 0.05) == outcome
    assert decide(None, 0.0, 0.0, 0.05) == CANT_TELL  # fewer than two paired seeds: no test, no verdict


def test_one_seed_is_cant_tell_without_a_test():
    v = judge(family(x=[0.3]), "primary", 0.05, 0.01)["x"]
    assert (
        v.outcome == CANT_TELL and v.test is None and v.sentence() == "can't tell: fewer than 2 paired seeds, no test"
    )
    assert table_cells(v)[:5] == ["n/a"] * 5
