"""The 2×2 reading of four arms (docs/mup.md): a control, setting A alone, setting B alone and both together —
does either setting move the wide width's gap, L(wide) − L(narrow), and does the one's effect depend on the other?

Per lr, over the seeds every arm finished at both widths without a diverged run (`paired_gaps`), each seed gives
its gaps g_control, g_A, g_B, g_AB, and three contrasts of them:
- the interaction, (g_AB − g_B) − (g_A − g_control): A's effect with B on minus A's effect without it;
- A's main effect, its effect averaged over B: [(g_A − g_control) + (g_AB − g_B)] / 2; B's the same way.
Each is a paired t-test over the seeds (one-sample on the per-seed contrast), Holm-adjusted over the grid's lrs
(a lr without a test counts as p = 1, so the family keeps its size). Calls: the interaction "interacts" when its
Holm p < 0.05; a main effect "narrows"/"widens the gap" the same way; "can't tell" otherwise; "fewer than 2
seeds" under two. Where the settings interact, a main effect is an average of two different effects and is
marked so. The rules are fixed here, before the width-512 runs of the arms they will judge."""

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from analysis.stats import TTest, decimals, format_p, paired_t
from lab.mup.arms import ALPHA, CANT_TELL, NARROWS, TOO_FEW, WIDENS, paired_gaps
from lab.verdicts import adjust

INTERACTS = "interacts"
AVERAGE = " (an average: the settings interact here)"


@dataclass(frozen=True)
class EffectRow:
    lr: float
    seeds: int
    test: Optional[TTest]  # None under two seeds
    p_holm: float  # nan without a test
    call: str


@dataclass(frozen=True)
class Effect:
    name: str  # "interaction", or the setting's arm name for a main effect
    rows: List[EffectRow]


@dataclass(frozen=True)
class Factorial:
    control: str
    a: str
    b: str
    ab: str
    interaction: Effect
    main_a: Effect
    main_b: Effect


def _effect(name: str, contrasts: dict, interacting: Sequence[float] = (), interaction: bool = False) -> Effect:
    """One contrast per lr: {lr: (per-seed first side, per-seed second side)}; the test is first − second."""
    tests = {lr: paired_t(*sides) for lr, sides in contrasts.items() if len(sides[0]) >= 2}
    holm = dict(zip(tests, adjust([t.p for t in tests.values()] + [math.nan] * (len(contrasts) - len(tests)))))
    rows = []
    for lr, sides in contrasts.items():
        test, p = tests.get(lr), holm.get(lr, math.nan)
        if test is None:
            call = TOO_FEW
        elif not p < ALPHA:
            call = CANT_TELL
        else:
            call = INTERACTS if interaction else WIDENS if test.delta > 0 else NARROWS
        if lr in interacting and not interaction:
            call += AVERAGE
        rows.append(EffectRow(lr, len(sides[0]), test, p, call))
    return Effect(name, rows)


def factorial(control: Path, a: Path, b: Path, ab: Path) -> Factorial:
    """The interaction and both main effects of the settings that `a` and `b` change, `ab` having both."""
    _, gaps, _ = paired_gaps([control, a, b, ab])
    interaction = _effect(
        "interaction",
        {lr: ([g[3] - g[2] for g in gs], [g[1] - g[0] for g in gs]) for lr, gs in gaps.items()},
        interaction=True,
    )
    interacting = [r.lr for r in interaction.rows if r.call == INTERACTS]
    main_a = _effect(
        a.name,
        {lr: ([(g[1] + g[3]) / 2 for g in gs], [(g[0] + g[2]) / 2 for g in gs]) for lr, gs in gaps.items()},
        interacting,
    )
    main_b = _effect(
        b.name,
        {lr: ([(g[2] + g[3]) / 2 for g in gs], [(g[0] + g[1]) / 2 for g in gs]) for lr, gs in gaps.items()},
        interacting,
    )
    return Factorial(control.name, a.name, b.name, ab.name, interaction, main_a, main_b)


def factorial_markdown(f: Factorial) -> str:
    """One table: per lr, the interaction and both main effects with their intervals, Holm p and calls."""
    out = [
        f"#### 2×2: `{f.a}` × `{f.b}` (both: `{f.ab}`; neither: `{f.control}`)",
        "",
        "Each cell: the effect on the gap L(wide) − L(narrow) in nats [95 % CI], Holm p over the lrs, the call.",
        "",
        f"| lr | seeds | interaction | main effect of `{f.a}` | main effect of `{f.b}` |",
        "|---:|---:|---|---|---|",
    ]
    for i, r in enumerate(f.interaction.rows):
        cells = [_cell(effect.rows[i]) for effect in (f.interaction, f.main_a, f.main_b)]
        out.append(f"| {r.lr:.3g} | {r.seeds} | " + " | ".join(cells) + " |")
    return "\n".join(out + [""])


def _cell(r: EffectRow) -> str:
    if r.test is None:
        return r.call
    d = decimals(r.test.half_width)
    return f"{r.test.delta:+.{d}f} [{r.test.low:+.{d}f}, {r.test.high:+.{d}f}], p {format_p(r.p_holm)}: {r.call}"
