"""Seed statistics: mean ± sample std over repeats, and paired (per-seed) and unpaired (Welch)
t-tests of one variant against another, with 95 % intervals and the one paired verdict (paired_verdict) that
compare_runs prints and the lab's families use."""

import math
import statistics
import warnings
from dataclasses import dataclass
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # the interval's level; a difference is called when it excludes 0 (p < 0.05)
CI = f"{CONFIDENCE * 100:.0f} % CI"
# Below this spread (relative to the values' magnitude, at least 1) every seed moved by the same amount:
# manifests store bpb to 6 decimals, so a smaller spread is rounding, not seed noise, and t = d / 0 is no
# test. Above it the interval's half-width prints as non-zero at decimals()' 6 digits.
ZERO_SPREAD = 1e-6


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float  # sample std (ddof=1); nan with fewer than two values
    n: int


def summarize(values: Sequence[float]) -> Summary:
    """Mean and *sample* std over seeds (ddof=1: the seeds are a sample of those one could have run, and with 2–3
    repeats ddof=0 would understate the noise by 30–40 %); one value has no spread: nan."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("summarize() needs at least one value")
    std = statistics.stdev(values) if len(values) > 1 else math.nan
    return Summary(statistics.fmean(values), std, len(values))


@dataclass(frozen=True)
class TTest:
    """A t-test of a difference (a − b): its estimate, confidence interval and two-sided p-value."""

    delta: float
    low: float
    high: float
    p: float  # nan when there is no spread estimate (one value)
    n: int  # pairs (paired) or the smaller group (Welch)
    zero_spread: bool = False  # every difference the same within ZERO_SPREAD: no interval, no test

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2


def paired_t(a: Sequence[float], b: Sequence[float]) -> TTest:
    """Student's paired t-test of a − b (scipy.stats.ttest_rel): pairing removes what both runs of a seed share
    (initialisation, batch order), so the noise left is the per-seed differences' — usually far less."""
    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if len(diffs) == 0:
        raise ValueError("paired_t() needs at least one pair")
    mean = float(diffs.mean())
    if len(diffs) == 1:
        return TTest(mean, math.nan, math.nan, math.nan, 1)
    scale = _scale(a, b)
    if no_spread(diffs, scale):  # t = d / 0: every seed moved by the same amount
        return _without_spread(mean, len(diffs), scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # near-identical values: scipy warns, the answer stands
        result = stats.ttest_rel(a, b)
    ci = result.confidence_interval(CONFIDENCE)
    return TTest(mean, float(ci.low), float(ci.high), float(result.pvalue), len(diffs))


def no_spread(values: Sequence[float], scale: float = 1.0) -> bool:
    """The values are equal within ZERO_SPREAD × scale (never exact float equality: 2.9 − 2.8 and
    3.0 − 2.9 differ in the 16th digit)."""
    return float(np.ptp(np.asarray(values, dtype=float))) <= ZERO_SPREAD * scale


def _scale(*groups: Sequence[float]) -> float:
    return max(1.0, *(abs(float(v)) for g in groups for v in g))


def _without_spread(delta: float, n: int, scale: float) -> TTest:
    """No spread to test against: a difference of 0 (within the tolerance) rejects nothing (p = 1); any
    other is the same in every seed (p = 0, said as such in the verdict, never as a t-test's p)."""
    if abs(delta) <= ZERO_SPREAD * scale:
        return TTest(0.0, 0.0, 0.0, 1.0, n, zero_spread=True)
    return TTest(delta, delta, delta, 0.0, n, zero_spread=True)


def welch_t(a: Sequence[float], b: Sequence[float]) -> Optional[TTest]:
    """Welch's unpaired t-test of mean(a) − mean(b) (unequal variances); None without 2 values each."""
    if len(a) < 2 or len(b) < 2:
        return None
    delta = statistics.fmean(a) - statistics.fmean(b)
    scale = _scale(a, b)
    if no_spread(a, scale) and no_spread(b, scale):
        return _without_spread(delta, min(len(a), len(b)), scale)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        result = stats.ttest_ind(a, b, equal_var=False)
    ci = result.confidence_interval(CONFIDENCE)
    return TTest(delta, float(ci.low), float(ci.high), float(result.pvalue), min(len(a), len(b)))


@dataclass(frozen=True)
class Comparison:
    """A variant against a reference, seed by seed: Δ = variant − reference (lower bpb is better)."""

    paired: Optional[TTest]  # over the seeds both ran; None when they share none
    unpaired: Optional[TTest]  # Welch over all seeds of each; None without two seeds each
    common_seeds: Tuple[int, ...]
    unmatched_seeds: Tuple[int, ...]  # seeds only one side ran: left out of the paired test

    @property
    def test(self) -> Optional[TTest]:
        """The test the verdict rests on: paired with two or more common seeds, else Welch."""
        if self.paired is not None and self.paired.n >= 2:
            return self.paired
        return self.unpaired

    @property
    def outcome(self) -> str:
        """better | worse | same | unclear (a spread, but the interval holds 0) | none (no test)."""
        t = self.test
        if t is None:
            return "none"
        if t.zero_spread and t.delta == 0:  # _without_spread() set it to 0 within the tolerance
            return "same"
        if t.p < 1 - CONFIDENCE:
            return "better" if t.delta < 0 else "worse"
        return "unclear"

    def verdict(self, unit: str = "bpb") -> str:
        """One plain sentence, e.g. 'better: Δ = -0.031 ± 0.012 bpb (95 % CI), p = 0.004, 5 paired seeds'."""
        t = self.test
        if t is None:
            if not self.common_seeds:
                return "no verdict: no seed in common and too few seeds for an unpaired test"
            return f"no verdict: 1 paired seed (seed {self.common_seeds[0]}); a test needs at least 2"
        paired = t is self.paired
        basis = f"{t.n} paired seeds" if paired else f"unpaired (Welch), {len(self.common_seeds)} seed(s) in common"
        if self.unmatched_seeds and paired:
            basis += f"; seeds {', '.join(map(str, self.unmatched_seeds))} have no partner and are left out"
        return paired_verdict(t, CANT_TELL if self.outcome == "unclear" else self.outcome, unit, basis)


BETTER, WORSE, EQUIVALENT, CANT_TELL = "better", "worse", "equivalent", "can't tell"


def paired_verdict(
    t: Optional[TTest],
    outcome: str,
    unit: str = "bpb",
    basis: str = "",
    p: Optional[float] = None,
    p_name: str = "p",
    scope: str = "",
    tost=None,
    tost_p: float = math.nan,
    alpha: float = 1 - CONFIDENCE,
) -> str:
    """The one sentence a paired comparison ends in, compare_runs' and the lab's families' alike: the outcome, Δ with
    its 95 % CI, the p it rests on (family-adjusted, named and scoped, in a family), the seeds, and the TOST against
    ±margin where one was asked for (lab/stats.py's Tost). Without a test, `basis` says why."""
    if t is None:
        return f"{outcome}: {basis}"
    basis = basis or f"{t.n} paired seeds"
    if t.zero_spread and t.delta == 0 and tost is None:
        return f"identical in all {t.n} paired seeds"
    # Without spread there is no t-test: its p is said only as a family's adjusted one.
    tested = "no test" if t.zero_spread and not scope else p_text(t.p if p is None else p, p_name)
    tested += f" ({scope})" if scope else ""
    margin = f"±{tost.margin:g} {unit}" if tost else ""
    equivalence = f"TOST {margin}: {p_text(tost_p, p_name)}" if tost else "no TOST"
    if t.zero_spread:
        size = f"Δ = {t.delta:+.6g} {unit} in every seed (spread below {ZERO_SPREAD:g}: no interval)"
    else:
        d = decimals(t.half_width)
        size = f"Δ = {t.delta:+.{d}f} ± {t.half_width:.{d}f} {unit} ({CI})"
    if outcome == EQUIVALENT:
        interval = f"{(1 - 2 * alpha) * 100:.0f} % CI [{tost.low:+.4f}, {tost.high:+.4f}]"
        return f"equivalent within {margin}: {equivalence}, {interval}; {size}, difference {tested}, {basis}"
    if outcome in (BETTER, WORSE):
        within = f"; also inside {margin} ({equivalence})" if tost and tost_p < alpha else ""
        return f"{outcome}: {size}, {tested}{within}, {basis}"
    return f"{CANT_TELL}: {size}, {tested}" + (f"; {equivalence}" if scope else "") + f", {basis}"


def compare(variant: Dict[int, float], reference: Dict[int, float]) -> Comparison:
    """Compare {seed: value} of a variant against the reference's: paired over the seeds both ran."""
    common = tuple(sorted(set(variant) & set(reference)))
    unmatched = tuple(sorted(set(variant) ^ set(reference)))
    paired = paired_t([variant[s] for s in common], [reference[s] for s in common]) if common else None
    unpaired = welch_t(list(variant.values()), list(reference.values()))
    return Comparison(paired, unpaired, common, unmatched)


def format_p(p: float) -> str:
    """A p-value for a table's p column: '< 0.001', '0.0028', '0.42'. In a sentence use p_text()."""
    if math.isnan(p):
        return "n/a"
    if p < 1e-3:
        return "< 0.001"
    return f"{p:.2g}" if p < 0.1 else f"{p:.2f}"


def p_text(p: float, name: str = "p") -> str:
    """A p-value in a sentence: 'p < 0.001' or 'p = 0.0028' (never 'p = < 0.001')."""
    text = format_p(p)
    return f"{name} {text}" if text.startswith("<") else f"{name} = {text}"


def decimals(half_width: float) -> int:
    """Enough decimals to show the interval's half-width to two significant digits (2 to 6)."""
    if not half_width or not math.isfinite(half_width):
        return 4
    return min(6, max(2, 1 - math.floor(math.log10(half_width))))
