"""analysis/stats.py against textbook answers: Student's sleep data (paired t, Welch), plus the
edge cases a seed study meets — one seed, seeds that do not match, no spread at all."""

import math
import statistics

import numpy as np
import pytest

from analysis.stats import (
    ZERO_SPREAD,
    compare,
    decimals,
    format_p,
    p_text,
    paired_t,
    summarize,
    welch_t,
)

# Cushny & Peebles' soporific data as Student (1908) analysed it, R's `sleep`: extra hours of sleep
# of the same 10 patients under drug 1 and drug 2.
DRUG1 = [0.7, -1.6, -0.2, -1.2, -0.1, 3.4, 3.7, 0.8, 0.0, 2.0]
DRUG2 = [1.9, 0.8, 1.1, 0.1, -0.1, 4.4, 5.5, 1.6, 4.6, 3.4]


def test_paired_t_reproduces_students_sleep_data():
    # R: t.test(extra ~ group, data = sleep, paired = TRUE) on drug 2 − drug 1:
    # mean difference 1.58, t = 4.0621, df = 9, p-value = 0.002833, 95 % CI [0.7001, 2.4599].
    t = paired_t(DRUG2, DRUG1)
    assert t.delta == pytest.approx(1.58) and t.n == 10
    assert t.p == pytest.approx(0.002833, abs=1e-6)
    assert (t.low, t.high) == (pytest.approx(0.7001142, abs=1e-6), pytest.approx(2.4598858, abs=1e-6))
    assert t.delta / (t.half_width / 2.262157) == pytest.approx(4.0621, abs=1e-4)  # t = d / se; t_0.975,9 = 2.262157


def test_welch_reproduces_the_unpaired_sleep_analysis():
    # R: t.test(extra ~ group, data = sleep) (Welch): t = -1.8608, df = 17.776, p-value = 0.07939,
    # 95 % CI of drug 1 − drug 2 [-3.3654832, 0.2054832]: not significant, although the paired test is.
    t = welch_t(DRUG1, DRUG2)
    assert t.delta == pytest.approx(-1.58) and t.p == pytest.approx(0.07939, abs=1e-5)
    assert (t.low, t.high) == (pytest.approx(-3.3654832, abs=1e-6), pytest.approx(0.2054832, abs=1e-6))


def test_pairing_is_what_makes_the_sleep_data_significant():
    c = compare(dict(enumerate(DRUG1)), dict(enumerate(DRUG2)))  # drug 1 is the "variant": lower is "better"
    assert c.test is c.paired and c.outcome == "better"
    assert c.unpaired.p > 0.05 > c.paired.p
    assert c.verdict("h") == "better: Δ = -1.58 ± 0.88 h (95 % CI), p = 0.0028, 10 paired seeds"


def test_verdicts_in_plain_words():
    better = compare({0: 1.00, 1: 1.11, 2: 1.19}, {0: 1.10, 1: 1.20, 2: 1.30})
    assert better.outcome == "better" and better.verdict().startswith("better: Δ = -0.100 ± 0.")
    worse = compare({0: 1.10, 1: 1.20, 2: 1.30}, {0: 1.00, 1: 1.11, 2: 1.19})
    assert worse.outcome == "worse" and worse.verdict().startswith("worse: Δ = +0.100")
    assert " bpb " in worse.verdict() and " nats " in worse.verdict("nats")  # the unit it is given, bpb by default
    unclear = compare({0: 1.0, 1: 1.3, 2: 1.1}, {0: 1.1, 1: 1.1, 2: 1.1})
    assert unclear.outcome == "unclear"
    assert unclear.verdict() == "can't tell: Δ = +0.03 ± 0.38 bpb (95 % CI), p = 0.74, 3 paired seeds"


def test_one_seed_gives_a_difference_but_no_verdict():
    c = compare({0: 1.0}, {0: 1.5})
    assert c.paired.delta == -0.5 and math.isnan(c.paired.low) and math.isnan(c.paired.p)
    assert c.unpaired is None and c.test is None and c.outcome == "none"
    assert c.verdict() == "no verdict: 1 paired seed (seed 0); a test needs at least 2"


def test_unequal_seed_sets_pair_only_the_common_seeds_and_say_so():
    variant = {0: 1.00, 1: 1.10, 2: 1.21, 3: 5.0}  # seed 3: no partner (and an outlier that must not count)
    reference = {0: 1.05, 1: 1.16, 2: 1.25, 4: 0.1}
    c = compare(variant, reference)
    assert c.common_seeds == (0, 1, 2) and c.unmatched_seeds == (3, 4)
    expected = paired_t([1.00, 1.10, 1.21], [1.05, 1.16, 1.25])
    assert c.paired == expected and c.paired.n == 3
    assert c.unpaired.n == 4 and c.unpaired.delta == pytest.approx(
        np.mean(list(variant.values())) - np.mean(list(reference.values()))
    )
    assert "3 paired seeds; seeds 3, 4 have no partner and are left out" in c.verdict()


def test_no_common_seed_falls_back_to_welch():
    c = compare({0: 1.0, 1: 1.1}, {2: 2.0, 3: 2.1})
    assert c.paired is None and c.test is c.unpaired and c.outcome == "better"
    assert "unpaired (Welch), 0 seed(s) in common" in c.verdict()
    assert compare({0: 1.0}, {1: 2.0}).verdict().startswith("no verdict: no seed in common")


def test_zero_spread_is_decided_without_dividing_by_zero():
    same_shift = compare({0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.5, 1: 2.5, 2: 3.5})  # every seed exactly 0.5 better
    t = same_shift.paired
    assert t.zero_spread and (t.delta, t.low, t.high, t.p) == (-0.5, -0.5, -0.5, 0.0)
    assert same_shift.outcome == "better" and "Δ = -0.5 bpb in every seed" in same_shift.verdict()
    identical = compare({0: 1.0, 1: 2.0}, {0: 1.0, 1: 2.0})
    assert identical.outcome == "same" and identical.verdict() == "identical in all 2 paired seeds"
    flat = welch_t([1.0, 1.0], [2.0, 2.0])
    assert flat.zero_spread and flat.p == 0.0 and flat.delta == -1.0


def test_summarize_is_mean_and_sample_std():
    values = [1.0, 1.3, 1.1, 0.95]
    s = summarize(values)
    assert s.mean == pytest.approx(np.mean(values)) and s.n == 4
    assert s.std == pytest.approx(np.std(values, ddof=1)) == pytest.approx(statistics.stdev(values))
    assert s.std > np.std(values)  # the sample (ddof=1) std, not the population one
    assert math.isnan(summarize([2.0]).std)
    with pytest.raises(ValueError):
        summarize([])


@pytest.mark.parametrize(
    "p, text",
    [
        (0.0028329, "0.0028"),
        (0.0004, "< 0.001"),
        (0.001, "0.001"),
        (0.42, "0.42"),
        (0.049, "0.049"),
        (0.1, "0.10"),
        (0.5, "0.50"),
        (1.0, "1.00"),
        (float("nan"), "n/a"),
    ],
)
def test_p_values_read_at_a_glance(p, text):
    assert format_p(p) == text


@pytest.mark.parametrize("half_width, digits", [(0.88, 2), (0.012, 3), (0.0012, 4), (1e-9, 6), (0.0, 4), (12.0, 2)])
def test_decimals_show_two_significant_digits_of_the_interval(half_width, digits):
    assert decimals(half_width) == digits


def test_summarize_of_nothing_says_so():
    with pytest.raises(ValueError) as raised:
        summarize([])
    assert str(raised.value) == "summarize() needs at least one value"


def test_two_values_have_a_spread_and_an_empty_paired_test_says_so():
    assert summarize([1.0, 3.0]).std == pytest.approx(math.sqrt(2))
    with pytest.raises(ValueError) as raised:
        paired_t([], [])
    assert str(raised.value) == "paired_t() needs at least one pair"
    one = paired_t([1.5], [1.0])
    assert one.delta == 0.5 and one.n == 1 and all(math.isnan(v) for v in (one.low, one.high, one.p))


def test_zero_spread_and_too_few_values_in_both_tests():
    same = paired_t([1.0, 2.0], [1.0, 2.0])  # no difference at all: nothing to reject
    assert same.zero_spread and same.p == 1.0 and (same.low, same.high) == (0.0, 0.0)
    assert welch_t([1.0], [1.0, 2.0, 3.0]) is None and welch_t([1.0, 2.0], [1.0]) is None
    shifted = welch_t([2.0, 2.0], [1.0, 1.0, 1.0])
    assert shifted.zero_spread and shifted.p == 0.0 and (shifted.low, shifted.high) == (1.0, 1.0)
    assert shifted.n == 2  # the smaller group
    flat = welch_t([1.0, 1.0], [1.0, 1.0, 1.0])  # no spread and no difference: nothing to reject
    assert flat.zero_spread and flat.p == 1.0 and flat.delta == 0.0 and flat.n == 2
    one_sided = welch_t([2.0, 2.0, 2.0], [1.0, 1.5, 0.5])  # only one group without spread: a real test
    assert not one_sided.zero_spread and 0 < one_sided.p < 1 and one_sided.low < 1.0 < one_sided.high


@pytest.mark.parametrize(
    "p, text", [(0.0004, "p < 0.001"), (0.0028329, "p = 0.0028"), (0.42, "p = 0.42"), (float("nan"), "p = n/a")]
)
def test_a_p_value_in_a_sentence_never_reads_p_equals_less_than(p, text):
    assert p_text(p) == text and p_text(p, "Holm p").startswith("Holm p")


def test_verdict_sentences_say_p_below_not_p_equals_below():
    far = compare({0: 2.0, 1: 2.2, 2: 2.4, 3: 2.1}, {0: 1.0, 1: 1.21, 2: 1.39, 3: 1.1})  # 1 bpb worse, tightly
    assert far.paired.p < 1e-3
    assert "p < 0.001" in far.verdict() and "p = <" not in far.verdict()


def test_float_noise_is_no_spread_and_is_reported_as_such():
    """0.7 − 0.6 and 1.7 − 1.6 differ in the 16th digit: exact equality would call that a spread, test it
    (t ≈ 1e15, p ≈ 0) and print '± 0.000000, p < 0.001'."""
    a, b = [0.7, 1.7, 2.7], [0.6, 1.6, 2.6]
    assert np.ptp(np.subtract(a, b)) > 0  # the float noise is there
    t = paired_t(a, b)
    assert t.zero_spread and t.p == 0.0 and (t.low, t.high) == (t.delta, t.delta)
    sentence = compare(dict(enumerate(a)), dict(enumerate(b))).verdict()
    assert sentence == "worse: Δ = +0.1 bpb in every seed (spread below 1e-06: no interval), no test, 3 paired seeds"
    assert "±" not in sentence and "p <" not in sentence
    tiny = paired_t([1.0 + 4e-7, 2.0, 3.0], [1.0, 2.0, 3.0])  # below the tolerance, around zero: identical
    assert tiny.zero_spread and tiny.delta == 0.0 and tiny.p == 1.0
    real = paired_t([1.0 + 5 * ZERO_SPREAD, 2.0 + 10 * ZERO_SPREAD, 3.0], [1.0, 2.0, 3.0])  # above it: a real test
    assert not real.zero_spread and f"{real.half_width:.6f}" != "0.000000"
    assert welch_t([0.7 - 0.6, 1.7 - 1.6], [0.0, 0.0]).zero_spread
