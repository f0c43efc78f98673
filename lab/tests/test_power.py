"""analysis/power.py against G*Power's and statsmodels' published values and a hand calculation with
scipy's noncentral t: the minimum detectable effect, the seeds a target needs, the pooled spread."""

import math

import numpy as np
import pytest
from scipy import stats

from lab import stats as power


def power_by_hand(effect: float, sd: float, n: int, alpha: float) -> float:
    """A two-sided one-sample (paired) t-test's power: T ~ noncentral t(n − 1, effect / sd · √n) beyond ±t_crit."""
    df, nc = n - 1, effect / sd * math.sqrt(n)
    crit = stats.t.ppf(1 - alpha / 2, df)
    return float(stats.nct.sf(crit, df, nc) + stats.nct.cdf(-crit, df, nc))


def test_seeds_for_a_medium_effect_match_gpower():
    # G*Power 3, "t tests - Means: Difference from constant (one sample case)" / matched pairs: d = 0.5,
    # α = 0.05 two-tailed, power 0.80 → total sample size 34, actual power 0.8077775 (statsmodels'
    # TTestPower().solve_power(0.5, alpha=0.05, power=0.8) = 33.367, rounded up).
    assert power.seeds_for(target=0.5, sd=1.0, alpha=0.05) == 34
    assert power_by_hand(0.5, 1.0, 34, 0.05) == pytest.approx(0.8077775, abs=1e-6)
    assert power.mde(1.0, 34, 0.05) < 0.5 < power.mde(1.0, 33, 0.05)


@pytest.mark.parametrize("n, alpha", [(3, 0.05), (5, 0.0125), (8, 0.05 / 6), (20, 0.01)])
def test_the_mde_has_exactly_the_asked_power(n, alpha):
    sd = 0.0327
    effect = power.mde(sd, n, alpha)
    assert power_by_hand(effect, sd, n, alpha) == pytest.approx(0.8, abs=1e-5)
    assert power_by_hand(effect * 0.9, sd, n, alpha) < 0.8 < power_by_hand(effect * 1.1, sd, n, alpha)
    assert power.mde(2 * sd, n, alpha) == pytest.approx(2 * effect)  # linear in the spread


def test_fewer_than_two_seeds_detect_nothing_and_more_seeds_detect_less():
    assert power.mde(0.01, 1, 0.05) == math.inf
    mdes = [power.mde(0.01, n, 0.0125) for n in range(3, 12)]
    assert mdes == sorted(mdes, reverse=True)
    needed = power.seeds_for(0.02, 0.01, 0.0125)
    assert power.mde(0.01, needed, 0.0125) <= 0.02 < power.mde(0.01, needed - 1, 0.0125)
    assert power.seeds_for(1.0, 0.0, 0.05) == 2 and power.seeds_for(1e-6, 1.0, 0.05) is None  # unreachable


def test_pooled_sd_is_the_within_group_spread():
    groups = {"a": [0.1, 0.2, 0.3], "b": [5.0, 5.2], "c": [7.0]}  # c has no spread to offer
    ss = sum(((np.array(v) - np.mean(v)) ** 2).sum() for v in (groups["a"], groups["b"]))
    assert power.pooled_sd(groups) == pytest.approx(math.sqrt(ss / 3)) and power.pooled_dof(groups) == 3
    assert power.pooled_sd({"a": [1.0]}) is None
