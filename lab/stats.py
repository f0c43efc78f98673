"""The lab's statistics over statsmodels and scipy: a family's verdicts (Holm over paired t-tests and TOSTs), power before
cost (what n seeds detect, the seeds a target needs) and optional stopping guarded (each look recorded)."""

import math
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests
from statsmodels.stats.power import TTestPower
from statsmodels.stats.weightstats import ttost_paired

from analysis.stats import BETTER, CANT_TELL, EQUIVALENT, WORSE, TTest, paired_t, paired_verdict


@dataclass(frozen=True)
class Tost:
    """Schuirmann's two one-sided tests of the mean paired difference against ±margin."""

    p_lower: float  # H0: Δ ≤ −margin (rejected: Δ is above the lower bound)
    p_upper: float  # H0: Δ ≥ +margin (rejected: Δ is below the upper bound)
    low: float  # the (1 − 2α) interval; equivalence at α ⇔ it lies inside ±margin
    high: float
    margin: float

    @property
    def p(self) -> float:
        """Equivalence is shown only when both one-sided nulls are rejected: the larger p decides."""
        return max(self.p_lower, self.p_upper)


def paired_tost(a: Sequence[float], b: Sequence[float], margin: float, alpha: float = 0.05) -> Optional[Tost]:
    """TOST of mean(a − b) within ±margin over matched pairs (statsmodels' ttost_paired); None under two pairs."""
    if len(a) < 2:
        return None
    t = paired_t(a, b)
    if t.zero_spread:  # no spread: the difference is what it is in every seed
        inside = abs(t.delta) < margin
        return Tost(0.0 if inside else 1.0, 0.0 if inside else 1.0, t.delta, t.delta, margin)
    _, (_, p_lower, _), (_, p_upper, _) = ttost_paired(np.asarray(a, float), np.asarray(b, float), -margin, margin)
    ci = stats.ttest_rel(a, b).confidence_interval(1 - 2 * alpha)
    return Tost(float(p_lower), float(p_upper), float(ci.low), float(ci.high), margin)


def adjust(pvalues: Sequence[float], method: str = "holm") -> list:
    """Family-wise adjusted p-values (statsmodels.stats.multitest.multipletests). A contrast without a
    test (nan) counts as p = 1: the family keeps its pre-registered size."""
    if not pvalues:
        return []
    finite = [1.0 if p is None or math.isnan(p) else float(p) for p in pvalues]
    return [float(p) for p in multipletests(finite, method=method)[1]]


@dataclass(frozen=True)
class Verdict:
    """One contrast's result within its family. Δ = variant − reference (lower bpb is better)."""

    test: Optional[TTest]  # the paired t-test; None without two common seeds
    tost: Optional[Tost]
    p_adjusted: float  # the difference test's p, family-adjusted (nan without a test)
    tost_adjusted: float  # the TOST's p, adjusted over the same family
    outcome: str  # BETTER, WORSE, EQUIVALENT or CANT_TELL
    family: str  # e.g. "primary, own LR"
    family_size: int
    alpha: float
    unit: str = "bpb"
    method: str = "holm"

    def sentence(self) -> str:
        """e.g. 'better: Δ = -0.031 ± 0.012 bpb (95 % CI), Holm p = 0.004 (primary, own LR family of 4), 5 paired
        seeds'."""
        return paired_verdict(
            self.test,
            self.outcome,
            self.unit,
            basis="" if self.test else "fewer than 2 paired seeds, no test",
            p=self.p_adjusted,
            p_name=f"{method_name(self.method)} p",
            scope=f"{self.family} family of {self.family_size}",
            tost=self.tost,
            tost_p=self.tost_adjusted,
            alpha=self.alpha,
        )


def method_name(method: str) -> str:
    """statsmodels' method name as a reader knows it: holm → Holm, holm-sidak → Holm-Sidak."""
    names = {"holm": "Holm", "bonferroni": "Bonferroni", "holm-sidak": "Holm-Sidak", "hommel": "Hommel"}
    return names.get(method, method)


def decide(test: Optional[TTest], p_adjusted: float, tost_adjusted: float, alpha: float) -> str:
    """Better/worse when the adjusted difference test rejects 'no difference'; else equivalent when the
    adjusted TOST rejects 'a difference of at least the margin'; else can't tell (absence of evidence
    is not equivalence)."""
    if test is None or test.n < 2:
        return CANT_TELL
    if p_adjusted < alpha:
        return BETTER if test.delta < 0 else WORSE
    if tost_adjusted < alpha:
        return EQUIVALENT
    return CANT_TELL


Pairs = Tuple[Sequence[float], Sequence[float]]  # (variant, reference) values over their common seeds


def judge(
    family: Dict[str, Pairs], name: str, alpha: float, margin: float, method: str = "holm", unit: str = "bpb"
) -> Dict[str, Verdict]:
    """Every contrast of one family: its paired t-test and TOST, both adjusted over the family."""
    tests = {k: paired_t(a, b) if len(a) >= 2 else None for k, (a, b) in family.items()}
    tosts = {k: paired_tost(a, b, margin, alpha) for k, (a, b) in family.items()}
    keys = list(family)
    p_adj = dict(zip(keys, adjust([tests[k].p if tests[k] else math.nan for k in keys], method)))
    tost_adj = dict(zip(keys, adjust([tosts[k].p if tosts[k] else math.nan for k in keys], method)))
    verdicts = {}
    for k in keys:
        outcome = decide(tests[k], p_adj[k], tost_adj[k], alpha)
        verdicts[k] = Verdict(tests[k], tosts[k], p_adj[k], tost_adj[k], outcome, name, len(keys), alpha, unit, method)
    return verdicts


# --- power before cost: a paired t-test is a one-sample t-test of the per-seed differences ---

POWER = 0.8  # the conventional 80 %: a real effect of the MDE's size is missed one time in five
MAX_SEEDS = 1000  # solve_power's search bound: beyond it the target is not reachable by seeds


def mde(sd: float, n: int, alpha: float, power: float = POWER) -> float:
    """Minimum detectable effect (in sd's unit): the |mean paired difference| a two-sided paired t-test at `alpha`
    detects with probability `power` on n pairs whose differences have spread sd; inf under 2 pairs (no test)."""
    if n < 2:
        return math.inf
    d = TTestPower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, alternative="two-sided")
    return float(d) * sd


def seeds_for(target: float, sd: float, alpha: float, power: float = POWER) -> Optional[int]:
    """The fewest paired seeds whose MDE is at most `target` (at least 2); None when even MAX_SEEDS are not enough."""
    if sd <= 0:
        return 2
    n = TTestPower().solve_power(effect_size=target / sd, nobs=None, alpha=alpha, power=power, alternative="two-sided")
    n = max(2, math.ceil(float(np.atleast_1d(n)[0]) - 1e-9))
    while n <= MAX_SEEDS and mde(sd, n, alpha, power) > target:  # solve_power's root is approximate
        n += 1
    return n if n <= MAX_SEEDS else None


def pooled_sd(groups: Dict[str, Sequence[float]]) -> Optional[float]:
    """The pooled sample std of several groups of paired differences (each about its own mean):
    sqrt(Σ (n_i − 1) s_i² / Σ (n_i − 1)). None without a group of two or more."""
    spread = [np.asarray(v, dtype=float) for v in groups.values() if len(v) >= 2]
    dof = pooled_dof(groups)
    return math.sqrt(sum(float(((v - v.mean()) ** 2).sum()) for v in spread) / dof) if dof else None


def pooled_dof(groups: Dict[str, Sequence[float]]) -> int:
    return sum(len(v) - 1 for v in groups.values() if len(v) >= 2)


# --- optional stopping, guarded ---

Looks = List[dict]  # [{"time": …, "seeds": {group: [seeds]}, "sequential": bool}, …]


class LookError(ValueError):
    """Seeds would be added after a look without a sequential design: one line that says what to do."""


def check_added_seeds(looks: Looks, planned: Dict[str, Sequence[int]], sequential: bool, how: str) -> None:
    """Refuse to run seeds of a group beyond those an earlier look judged, unless `sequential`.
    how: what to tell the user instead (e.g. 'or use a new --dir')."""
    if sequential:
        return
    for group, seeds in planned.items():
        seen = {int(s) for look in looks for s in (look.get("seeds") or {}).get(group, [])}
        added = sorted(set(seeds) - seen)
        if seen and added:
            raise LookError(
                f"{group}: seeds {', '.join(map(str, added))} would be added after a look at seeds "
                f"{', '.join(map(str, sorted(seen)))} — optional stopping inflates false positives; pass "
                f"--sequential to run them under a sequential design (each look judged at α / looks), {how}"
            )


def record(looks: Looks, seeds: Dict[str, Sequence[int]], sequential: bool) -> Looks:
    """The looks with this one appended (unless it judges the same seeds as the last one did)."""
    entry = {"seeds": {g: sorted(int(s) for s in v) for g, v in seeds.items() if v}, "sequential": bool(sequential)}
    if looks and {k: v for k, v in looks[-1].items() if k != "time"} == entry:
        return list(looks)
    return [*looks, {"time": time.strftime("%Y-%m-%d %H:%M:%S"), **entry}]


def alpha_for(alpha: float, looks: Looks, group: str) -> Tuple[float, int]:
    """(the level a group is judged at, K): α itself until a sequential look added seeds, then α / K with K
    the distinct seed sets looked at. Looks made without --sequential never split α (none added seeds)."""
    sets = {tuple((look.get("seeds") or {}).get(group, [])) for look in looks} - {()}  # the distinct seed sets
    k = len(sets) if any(look.get("sequential") for look in looks) else 1
    return alpha / max(1, k), max(1, k)
