"""Does it hold at scale? Each variant's paired Δ at every model size, whether its verdict keeps its
direction, and how well the sizes' rankings agree (Kendall's τ, scipy.stats.kendalltau)."""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from scipy import stats

from analysis.stats import Comparison, decimals

WORDS = {
    "better": "better",
    "worse": "worse",
    "unclear": "can't tell",
    "same": "identical",
    "none": "no verdict",
    "equivalent": "equivalent",
    "can't tell": "can't tell",
}


@dataclass
class SizeResult:
    name: str
    ranking: List[str]  # variant names, best first (mean final val bpb)
    comparisons: Dict[str, Comparison]  # variant → vs the reference at this size (or a verdicts.Verdict)


def consistency(outcomes: Sequence[Optional[str]]) -> str:
    """How one variant's verdicts (better/worse/unclear/…, None = not run) line up across sizes."""
    called = {o for o in outcomes if o in ("better", "worse")}
    if len(called) == 2:
        return "**flips**: better at one size, worse at another"
    if not called:
        if outcomes and all(o == "equivalent" for o in outcomes):
            return "**holds**: equivalent at every size"
        if any(o == "equivalent" for o in outcomes):
            return "partly: equivalent where shown, can't tell elsewhere"
        return "can't tell at any size" if any(o for o in outcomes) else "not run"
    direction = called.pop()
    if all(o == direction for o in outcomes):
        return f"**holds**: {direction} at every size"
    return f"partly: {direction} where called, not significant elsewhere"


def rank_agreement(a: Sequence[str], b: Sequence[str]) -> Optional[float]:
    """Kendall's τ between two rankings over the variants both hold (1 = same order, −1 = reversed)."""
    common = [v for v in a if v in b]
    if len(common) < 3:  # τ over two items is only ±1: say nothing
        return None
    return float(stats.kendalltau([a.index(v) for v in common], [b.index(v) for v in common]).statistic)


def markdown(results: Sequence[SizeResult], reference: str, unit: str = "bpb") -> str:
    """The scale check: Δ vs the reference per variant and size, its consistency, the rankings."""
    variants = list(dict.fromkeys(v for r in results for v in r.comparisons))
    header = ["variant"] + [f"Δ {unit} at {r.name}" for r in results] + ["across sizes"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in variants:
        cells, outcomes = [], []
        for r in results:
            c = r.comparisons.get(v)
            t = c.test if c else None
            outcomes.append(c.outcome if c else None)
            if t is None:
                cells.append("—")
                continue
            digits = decimals(t.half_width)
            spread = (
                "" if math.isnan(t.half_width) else " (no spread)" if t.zero_spread else f" ± {t.half_width:.{digits}f}"
            )
            cells.append(f"{t.delta:+.{digits}f}{spread} ({WORDS[c.outcome]})")
        lines.append("| " + " | ".join([v] + cells + [consistency(outcomes)]) + " |")
    lines += [
        "",
        f"Δ = variant − {reference} (paired, 95 % CI half-width). Ranking by mean final val {unit}, best first:",
        "",
    ]
    lines += [f"- {r.name}: " + " < ".join(r.ranking) for r in results]
    for first, second in zip(results, results[1:]):
        tau = rank_agreement(first.ranking, second.ranking)
        same = first.ranking == second.ranking
        agreement = (
            "the same order"
            if same
            else (f"Kendall's τ = {tau:+.2f}" if tau is not None else "different order (too few variants for τ)")
        )
        lines.append(f"- {first.name} → {second.name}: {agreement}")
    return "\n".join(lines) + "\n"
