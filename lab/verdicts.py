"""Verdicts on a family of pre-registered paired contrasts: Holm–Bonferroni over the family's paired
t-tests (statsmodels' multipletests), a paired TOST for "no difference beyond ±margin" (two one-sided
paired t-tests, scipy), and one of four outcomes: better, worse, equivalent within ±margin, can't tell."""

import math
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.stats import ZERO_SPREAD, TTest, decimals, format_p, p_text, paired_t

BETTER, WORSE, EQUIVALENT, CANT_TELL = "better", "worse", "equivalent", "can't tell"
OUTCOMES = (BETTER, WORSE, EQUIVALENT, CANT_TELL)


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
    """TOST of mean(a − b) within ±margin over matched pairs; None with fewer than two pairs."""
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(diffs) < 2:
        return None
    t = paired_t(a, b)
    if t.zero_spread:  # no spread: the difference is what it is in every seed
        inside = abs(t.delta) < margin
        return Tost(0.0 if inside else 1.0, 0.0 if inside else 1.0, t.delta, t.delta, margin)
    lower = stats.ttest_1samp(diffs, -margin, alternative="greater")
    upper = stats.ttest_1samp(diffs, margin, alternative="less")
    ci = stats.ttest_1samp(diffs, 0.0).confidence_interval(1 - 2 * alpha)
    return Tost(float(lower.pvalue), float(upper.pvalue), float(ci.low), float(ci.high), margin)


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
    outcome: str  # one of OUTCOMES
    family: str  # e.g. "primary, own LR"
    family_size: int
    alpha: float
    unit: str = "bpb"
    method: str = "holm"

    @property
    def adjusted(self) -> str:
        """How an adjusted p is named in a sentence: 'Holm p'."""
        return f"{method_name(self.method)} p"

    def sentence(self) -> str:
        """e.g. 'better by 0.031 ± 0.012 bpb (95 % CI), Holm p = 0.004 (primary family of 4); TOST ±0.01:
        Holm p = 0.62'."""
        t = self.test
        if t is None:
            return "can't tell: fewer than 2 paired seeds, no test"
        family = f"{self.family} family of {self.family_size}"
        margin = f"±{self.tost.margin:g} {self.unit}" if self.tost else ""
        tost = f"TOST {margin}: {p_text(self.tost_adjusted, self.adjusted)}" if self.tost else "no TOST"
        if t.zero_spread:
            size = f"Δ = {t.delta:+.6g} {self.unit} in every seed (spread below {ZERO_SPREAD:g}: no interval)"
        else:
            d = decimals(t.half_width)
            size = f"Δ = {t.delta:+.{d}f} ± {t.half_width:.{d}f} {self.unit} (95 % CI)"
        difference = f"{p_text(self.p_adjusted, self.adjusted)} ({family})"
        if self.outcome == EQUIVALENT:
            interval = f"{(1 - 2 * self.alpha) * 100:.0f} % CI [{self.tost.low:+.4f}, {self.tost.high:+.4f}]"
            return (
                f"equivalent within {margin}: {tost}, {interval}; {size}, difference {difference}, {t.n} paired seeds"
            )
        if self.outcome in (BETTER, WORSE):
            within = f"; also inside {margin} ({tost})" if self.tost_adjusted < self.alpha else ""
            return f"{self.outcome}: {size}, {difference}{within}, {t.n} paired seeds"
        return f"can't tell: {size}, {difference}; {tost}, {t.n} paired seeds"


def method_name(method: str) -> str:
    """statsmodels' method name as a reader knows it: holm → Holm, holm-sidak → Holm-Sidak."""
    return {"holm": "Holm", "bonferroni": "Bonferroni", "holm-sidak": "Holm-Sidak", "hommel": "Hommel"}.get(
        method, method
    )


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
    return {
        k: Verdict(
            tests[k],
            tosts[k],
            p_adj[k],
            tost_adj[k],
            decide(tests[k], p_adj[k], tost_adj[k], alpha),
            name,
            len(keys),
            alpha,
            unit,
            method,
        )
        for k in keys
    }


def table_cells(v: Verdict) -> list:
    """Δ, its 95 % CI, raw p, adjusted p, TOST adjusted p, outcome: a contrasts table's cells."""
    t = v.test
    if t is None:
        return ["n/a"] * 5 + [f"**{v.outcome}**"]
    interval = "no spread" if t.zero_spread else f"[{t.low:+.4f}, {t.high:+.4f}]"
    tost = format_p(v.tost_adjusted) if v.tost else "n/a"
    return [f"{t.delta:+.4f}", interval, format_p(t.p), format_p(v.p_adjusted), tost, f"**{v.outcome}**"]
