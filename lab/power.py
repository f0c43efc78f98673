"""Power before cost: the smallest paired difference a study of n seeds detects at a given power and
α, the seeds a target difference needs, and the spread of paired differences they rest on
(statsmodels' TTestPower: a paired t-test is a one-sample t-test of the per-seed differences)."""

import math
from typing import Dict, Optional, Sequence

import numpy as np

POWER = 0.8  # the conventional 80 %: a real effect of the MDE's size is missed one time in five
MAX_SEEDS = 1000  # solve_power's search bound: beyond it the target is not reachable by seeds


def _ttest_power():
    # Imported on first use: train.py's Hydra callback reads the protocol's cell files (cells.py →
    # protocol.py → here), and statsmodels + scipy.stats would add about a second to every run's start.
    from statsmodels.stats.power import TTestPower

    return TTestPower()


def mde(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """Minimum detectable effect (in sd's unit): the |mean paired difference| a two-sided paired
    t-test at `alpha` detects with probability `power` on n pairs whose differences have spread sd.
    inf with fewer than 2 pairs (no test)."""
    if n < 2:
        return math.inf
    d = _ttest_power().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")
    return float(d) * sd


def seeds_for(target: float, sd: float, alpha: float, power: float = POWER) -> Optional[int]:
    """The fewest paired seeds whose MDE is at most `target` (at least 2); None when even MAX_SEEDS
    are not enough."""
    if sd <= 0:
        return 2
    n = _ttest_power().solve_power(
        effect_size=target / sd, nobs=None, alpha=alpha, power=power, alternative="two-sided"
    )
    n = max(2, math.ceil(float(np.atleast_1d(n)[0]) - 1e-9))
    while n <= MAX_SEEDS and mde(sd, n, alpha, power) > target:  # solve_power's root is approximate
        n += 1
    return n if n <= MAX_SEEDS else None


def pooled_sd(groups: Dict[str, Sequence[float]]) -> Optional[float]:
    """The pooled sample std of several groups of paired differences (each about its own mean):
    sqrt(Σ (n_i − 1) s_i² / Σ (n_i − 1)). None without a group of two or more."""
    sums, dof = 0.0, 0
    for values in groups.values():
        values = np.asarray(values, dtype=float)
        if len(values) >= 2:
            sums += float(((values - values.mean()) ** 2).sum())
            dof += len(values) - 1
    return math.sqrt(sums / dof) if dof else None


def pooled_dof(groups: Dict[str, Sequence[float]]) -> int:
    return sum(len(v) - 1 for v in groups.values() if len(v) >= 2)
