"""The protocol's pre-registered contrasts, judged (each variant vs the reference, paired over the measuring seeds, at
its own and the shared LR; Holm within a family, a paired TOST, a study-wide Holm p); their tables; the scale check."""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

from scipy import stats
from statsmodels.stats.multitest import multipletests

from analysis.stats import decimals, format_p
from analysis.table import table_lines
from lab.ablation.protocol import TIERS, Cell, CellState, Spec
from lab.stats import Verdict, judge, method_name
from lab.sweep import DIVERGED, FINISHED

LR_CHOICES = ("own", "shared")
LR_WORDS = {"own": "each variant at its own best LR", "shared": "every variant at the reference's best LR"}
States = Dict[Cell, CellState]
Chosen = Dict[str, Dict[str, Optional[float]]]


@dataclass
class Contrast:
    size: str
    variant: str
    tier: str  # primary | secondary
    choice: str  # own | shared
    lr: Optional[float]  # the variant's LR in this contrast; None: it has none (diverged at every LR)
    reference_lr: Optional[float]
    variant_bpb: Dict[int, float]  # seed → final val bpb of the finished runs
    reference_bpb: Dict[int, float]
    verdict: Verdict
    diverged: int = 0  # the variant's runs of this contrast that diverged (not in its values)
    study_p: Optional[float] = None  # its p under one Holm correction over all the study's distinct tests
    study_tests: int = 0

    @property
    def seeds(self) -> List[int]:
        return sorted(set(self.variant_bpb) & set(self.reference_bpb))

    def sentence(self) -> str:
        """The verdict's sentence, with why a contrast has no test when its variant diverged."""
        if self.lr is None:
            return "can't tell: no test — diverged at every LR tried"
        why = f" ({self.diverged} run(s) diverged at lr {self.lr:g})" if self.diverged else ""
        if self.study_p is None:
            return self.verdict.sentence() + why
        wide = f"study-wide Holm p = {self.study_p:.3g} over its {self.study_tests} distinct tests"
        if self.verdict.outcome in ("better", "worse") and self.study_p >= self.verdict.alpha:
            return f"can't tell study-wide ({wide}); {self.verdict.sentence()} within its family only{why}"
        return f"{self.verdict.sentence()}; {wide}{why}"


def seed_values(states: States, size: str, variant: str, lr: Optional[float], seeds) -> Dict[int, float]:
    """{seed: final val bpb} of the finished cells of one (size, variant, LR) on the measuring seeds."""
    if lr is None:
        return {}
    found = {seed: states.get(Cell(size, variant, lr, seed)) for seed in seeds}
    return {seed: s.final_bpb for seed, s in found.items() if s is not None and s.state == FINISHED}


def judge_protocol(spec: Spec, states: States, chosen: Chosen, alpha: Optional[float] = None) -> List[Contrast]:
    """Every contrast of every family (LR choice × tier), each family adjusted on its own, at `alpha`
    (spec.alpha unless a sequential design split it over looks)."""
    out = []
    for choice in LR_CHOICES:
        for tier in TIERS:
            rows = {}
            for size in spec.sizes:
                ref_lr = chosen.get(size, {}).get(spec.reference)
                reference = seed_values(states, size, spec.reference, ref_lr, spec.seeds)
                for variant in [v for v in spec.family(tier) if spec.runs_at(v, size)]:
                    lr = chosen.get(size, {}).get(variant) if choice == "own" else ref_lr
                    rows[size, variant] = (lr, ref_lr, seed_values(states, size, variant, lr, spec.seeds), reference)
            if not rows:
                continue
            pairs = {
                key: ([mine[s] for s in sorted(set(mine) & set(ref))], [ref[s] for s in sorted(set(mine) & set(ref))])
                for key, (_, _, mine, ref) in rows.items()
            }
            verdicts = judge(
                pairs, f"{tier}, {choice} LR", alpha or spec.alpha, spec.equivalence_margin, spec.multitest
            )
            out += [
                Contrast(
                    size,
                    variant,
                    tier,
                    choice,
                    lr,
                    ref_lr,
                    mine,
                    ref,
                    verdicts[size, variant],
                    _diverged(states, size, variant, lr, spec.seeds),
                )
                for (size, variant), (lr, ref_lr, mine, ref) in rows.items()
            ]
    return study_wide(out)


def study_wide(contrasts: List[Contrast]) -> List[Contrast]:
    """The study's one error-control figure beside each family's: Holm over every distinct test (a contrast judged in
    both LR families on the same runs counts once), each contrast given its p there."""
    tested = [c for c in contrasts if c.verdict.test and math.isfinite(c.verdict.test.p)]
    tests = {(c.size, c.variant, c.lr, c.reference_lr): c.verdict.test.p for c in tested}
    if tests:
        adjusted = dict(zip(tests, multipletests(list(tests.values()), method="holm")[1]))
        for c in tested:
            c.study_p, c.study_tests = float(adjusted[c.size, c.variant, c.lr, c.reference_lr]), len(tests)
    return contrasts


def _diverged(states: States, size: str, variant: str, lr: Optional[float], seeds) -> int:
    found = [states.get(Cell(size, variant, lr, seed)) for seed in seeds] if lr is not None else []
    return sum(s is not None and s.state == DIVERGED for s in found)


def pick(contrasts: List[Contrast], **match) -> List[Contrast]:
    return [c for c in contrasts if all(getattr(c, k) == v for k, v in match.items())]


def markdown(spec: Spec, contrasts: List[Contrast], choice: str) -> str:
    """One LR choice: a table per family and a verdict sentence per contrast."""
    lines = [f"### {LR_WORDS[choice][0].upper() + LR_WORDS[choice][1:]}\n"]
    for tier in TIERS:
        rows = pick(contrasts, choice=choice, tier=tier)
        if not rows:
            continue
        method = method_name(spec.multitest)
        header = [
            "contrast",
            "size",
            "LR (variant / ref)",
            "seeds",
            "Δ bpb",
            "95 % CI",
            "p",
            f"{method} p",
            f"TOST ±{spec.equivalence_margin:g} ({method} p)",
            "verdict",
        ]
        lines += [
            f"**{tier.capitalize()} family** ({len(rows)} tests: {', '.join(spec.family(tier))} at the sizes "
            f"each runs at, {method} at α = {spec.alpha:g}):",
            "",
            *table_lines(
                header,
                [
                    [f"{c.variant} vs {spec.reference}", c.size, _lrs(c), str(len(c.seeds)), *table_cells(c.verdict)]
                    for c in rows
                ],
            ),
            "",
            *[f"- **{c.variant}** at {c.size}: {c.sentence()}" for c in rows],
            "",
        ]
    return "\n".join(lines)


def _lrs(c: Contrast) -> str:
    lr = lambda x: "diverged" if x is None else f"{x:g}"
    return f"{lr(c.lr)} / {lr(c.reference_lr)}"


def table_cells(v: Verdict) -> list:
    """Δ, its 95 % CI, raw p, adjusted p, TOST adjusted p, outcome: a contrasts table's cells."""
    t = v.test
    if t is None:
        return ["n/a"] * 5 + [f"**{v.outcome}**"]
    interval = "no spread" if t.zero_spread else f"[{t.low:+.4f}, {t.high:+.4f}]"
    tost = format_p(v.tost_adjusted) if v.tost else "n/a"
    return [f"{t.delta:+.4f}", interval, format_p(t.p), format_p(v.p_adjusted), tost, f"**{v.outcome}**"]


# --- does it hold at scale? ---


def consistency(outcomes: Sequence[Optional[str]]) -> str:
    """How one variant's verdicts (better/worse/equivalent/can't tell, None = not run) line up across sizes."""
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


def scale_markdown(
    verdicts: Dict[str, Dict[str, Verdict]], rankings: Dict[str, List[str]], reference: str, unit: str = "bpb"
) -> str:
    """The scale check from each size's {variant: verdict vs the reference} (own LR) and ranking (best first): Δ per
    variant and size, its consistency across sizes, and the rankings' agreement."""
    variants = list(dict.fromkeys(v for per_size in verdicts.values() for v in per_size))
    header = ["variant"] + [f"Δ {unit} at {size}" for size in verdicts] + ["across sizes"]
    rows = []
    for v in variants:
        cells, outcomes = [], []
        for per_size in verdicts.values():
            c = per_size.get(v)
            t = c.test if c else None
            outcomes.append(c.outcome if c else None)
            if t is None:
                cells.append("—")
                continue
            digits = decimals(t.half_width)
            spread = (
                "" if math.isnan(t.half_width) else " (no spread)" if t.zero_spread else f" ± {t.half_width:.{digits}f}"
            )
            cells.append(f"{t.delta:+.{digits}f}{spread} ({c.outcome})")
        rows.append([v] + cells + [consistency(outcomes)])
    lines = [
        *table_lines(header, rows),
        "",
        f"Δ = variant − {reference} (paired, 95 % CI half-width). Ranking by mean final val {unit}, best first:",
        "",
    ]
    sizes = list(verdicts)
    lines += [f"- {size}: " + " < ".join(rankings.get(size, [])) for size in sizes]
    for first, second in zip(sizes, sizes[1:]):
        tau = rank_agreement(rankings.get(first, []), rankings.get(second, []))
        same = rankings.get(first, []) == rankings.get(second, [])
        agreement = (
            "the same order"
            if same
            else (f"Kendall's τ = {tau:+.2f}" if tau is not None else "different order (too few variants for τ)")
        )
        lines.append(f"- {first} → {second}: {agreement}")
    return "\n".join(lines) + "\n"
