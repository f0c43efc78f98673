"""Seed statistics: mean ± sample std over repeats, and whether two variants differ beyond seed noise."""
import math
import statistics
from dataclasses import dataclass
from typing import Optional, Sequence


@dataclass(frozen=True)
class Summary:
    mean: float
    std: float  # sample std (ddof=1); nan with fewer than two values
    n: int


def summarize(values: Sequence[float]) -> Summary:
    """Mean and *sample* standard deviation (ddof=1, Bessel-corrected) over seeds.

    ddof=1 because the seeds are a sample of the seeds one could have run: with 2–3 repeats the
    population formula (ddof=0) would understate the noise by 30–40%. One value has no spread: nan.
    """
    values = [float(v) for v in values]
    if not values:
        raise ValueError("summarize() needs at least one value")
    std = statistics.stdev(values) if len(values) > 1 else math.nan
    return Summary(statistics.fmean(values), std, len(values))


def noise_of_difference(a: Summary, b: Summary) -> float:
    """Standard error of mean(a) − mean(b): sqrt(s_a²/n_a + s_b²/n_b); nan without two seeds each."""
    if a.n < 2 or b.n < 2:
        return math.nan
    return math.sqrt(a.std ** 2 / a.n + b.std ** 2 / b.n)


def within_noise(a: Summary, b: Summary, z: float = 2.0) -> Optional[bool]:
    """|mean_a − mean_b| < z · standard error of the difference (≈ a 95% interval at z = 2).

    None when either side has a single seed: then there is no noise estimate and no verdict.
    """
    se = noise_of_difference(a, b)
    if math.isnan(se):
        return None
    return abs(a.mean - b.mean) < z * se
