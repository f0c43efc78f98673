"""The width-512 AdamW experiment's question, asked of each arm (docs/mup.md): is the widest width no worse than
the narrowest at every lr? Per lr, the paired difference over the seeds both widths finished, L(wide) − L(narrow)
(lower loss is better), with its 95 % interval; a lr is "worse" when the paired t-test, Holm-adjusted over the
arm's lrs, rejects no difference at 0.05 with the wide width behind, or when only the wide width diverged. An arm
answers "no worse at every lr" only when every lr has two or more seeds and none is worse; until then it says
what is missing. The rule is fixed here, before the runs it will judge."""
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from analysis.stats import TTest, decimals, format_p, paired_t
from analysis.verdicts import adjust
from studies.mup.transfer import DIVERGED, SPEC_FILE, Cell, TransferSpec, read_results

ALPHA = 0.05
WORSE, BETTER, CANT_TELL, DIVERGED_WIDE, TOO_FEW = "worse", "better", "can't tell", "diverged at the wide width", \
    "fewer than 2 seeds"


@dataclass(frozen=True)
class LrRow:
    lr: float
    narrow: List[float]  # the paired seeds' final losses, narrowest width
    wide: List[float]
    test: Optional[TTest]  # None under two pairs
    p_holm: float  # nan without a test
    call: str


@dataclass(frozen=True)
class Arm:
    name: str
    settings: str  # the overrides every run of the arm shares
    narrow_width: int
    wide_width: int
    rows: List[LrRow]

    @property
    def answer(self) -> str:
        worse = [r for r in self.rows if r.call in (WORSE, DIVERGED_WIDE)]
        if worse:
            return f"width {self.wide_width} is worse than {self.narrow_width} at lr " + \
                ", ".join(f"{r.lr:.3g}" for r in worse)
        missing = [r for r in self.rows if r.call == TOO_FEW]
        if missing:
            return f"not yet: {len(missing)} of {len(self.rows)} lrs have fewer than two seeds at both widths"
        return f"width {self.wide_width} is no worse than {self.narrow_width} at every lr"


def judge_arm(directory: Path) -> Arm:
    """The arm in `directory` (an experiment of one optimizer, one parametrization, two or more widths)."""
    spec = TransferSpec.from_dict(json.loads((directory / SPEC_FILE).read_text()))
    if len(spec.optimizers) != 1 or len(spec.parametrizations) != 1:
        raise ValueError(f"{directory}: an arm has one optimizer and one parametrization")
    results, (optimizer,), (parametrization,) = read_results(directory), spec.optimizers, spec.parametrizations
    narrow, wide = min(spec.widths), max(spec.widths)
    pending = []
    for lr in spec.lrs:
        pairs = []  # (narrow, wide) rows of each seed both widths finished
        for seed in spec.seeds:
            rows = [results.get(Cell(optimizer, parametrization, w, lr, seed).name) for w in (narrow, wide)]
            if all(rows):
                pairs.append(rows)
        pending.append((lr, pairs))
    finite = {lr: [(a["val_loss"], b["val_loss"]) for a, b in pairs if DIVERGED not in (a["status"], b["status"])]
              for lr, pairs in pending}
    tests = {lr: paired_t([b for _, b in f], [a for a, _ in f]) for lr, f in finite.items() if len(f) >= 2}
    holm = dict(zip(tests, adjust([t.p for t in tests.values()])))
    rows = []
    for lr, pairs in pending:
        diverged_wide = any(b["status"] == DIVERGED and a["status"] != DIVERGED for a, b in pairs)
        test, p = tests.get(lr), holm.get(lr, math.nan)
        if diverged_wide:
            call = DIVERGED_WIDE
        elif test is None:
            call = TOO_FEW
        elif p < ALPHA:
            call = WORSE if test.delta > 0 else BETTER
        else:
            call = CANT_TELL
        rows.append(LrRow(lr, [a for a, _ in finite[lr]], [b for _, b in finite[lr]], test, p, call))
    return Arm(directory.name, " ".join(spec.overrides), narrow, wide, rows)


def arms_markdown(arms: Sequence[Arm]) -> str:
    """One table per arm: each lr's paired difference and call, then the arm's answer."""
    out = []
    for arm in arms:
        out += [f"#### `{arm.name}`: {arm.answer}", "", f"Settings: `{arm.settings}`.", "",
                f"| lr | seeds | loss at {arm.narrow_width} | loss at {arm.wide_width} | Δ ({arm.wide_width} − "
                f"{arm.narrow_width}) [95 % CI] | p (Holm) | call |", "|---:|---:|---:|---:|---|---:|---|"]
        for row in arm.rows:
            if row.test is None:  # one seed at most: its losses and difference, no interval
                losses = f"{row.narrow[0]:.4f} | {row.wide[0]:.4f} | {row.wide[0] - row.narrow[0]:+.4f} (one seed)" \
                    if row.wide else " | | "
                out.append(f"| {row.lr:.3g} | {len(row.wide)} | {losses} | | {row.call} |")
                continue
            t, d = row.test, decimals(row.test.half_width)
            out.append(f"| {row.lr:.3g} | {t.n} | {statistics.fmean(row.narrow):.4f} | {statistics.fmean(row.wide):.4f} "
                       f"| {t.delta:+.{d}f} [{t.low:+.{d}f}, {t.high:+.{d}f}] | {format_p(row.p_holm)} | {row.call} |")
        out.append("")
    return "\n".join(out)
