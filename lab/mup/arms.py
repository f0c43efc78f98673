"""The width-512 AdamW experiment's question, asked of each arm (docs/mup.md): is the widest width no worse than
the narrowest at every lr? Per lr, the paired difference over the seeds both widths finished, L(wide) − L(narrow)
(lower loss is better), with its 95 % interval; a lr is "worse" when the paired t-test, Holm-adjusted over the
arm's lrs, rejects no difference at 0.05 with the wide width behind, or when only the wide width diverged. Once
every lr has two or more seeds and none is worse, an arm answers "not shown worse at any lr", with the largest upper
bound of its intervals: a test that rejects nothing is not evidence of "no worse" (that would need a margin fixed
in advance and intervals under it), so the words claim no more than the test; until then it says what is missing.

Which setting moves the gap: each arm against the control (`compare_arms`), per lr, the paired difference over
seeds of the two arms' gaps, [L(wide) − L(narrow)] in the arm minus the same in the control (a seed draws the same
data and, but for what the arm changes, the same initial weights in both), Holm over the lrs; a seed with a diverged
run in either arm is left out and counted; "no lr where it is shown to move the gap" otherwise. The rules are
fixed here, before the runs they will judge."""

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from analysis.stats import TTest, decimals, format_p, paired_t
from lab.mup.transfer import DIVERGED, SPEC_FILE, Cell, TransferSpec, open_experiment, read_results
from lab.verdicts import adjust

ALPHA = 0.05
WORSE, BETTER, CANT_TELL, DIVERGED_WIDE, TOO_FEW = (
    "worse",
    "better",
    "can't tell",
    "diverged at the wide width",
    "fewer than 2 seeds",
)
NARROWS, WIDENS = "narrows the gap", "widens the gap"


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
            return f"width {self.wide_width} is worse than {self.narrow_width} at lr " + ", ".join(
                f"{r.lr:.3g}" for r in worse
            )
        missing = [r for r in self.rows if r.call == TOO_FEW]
        if missing:
            return f"not yet: {len(missing)} of {len(self.rows)} lrs have fewer than two seeds at both widths"
        top = max(r.test.high for r in self.rows)
        fewest, most = min(r.test.n for r in self.rows), max(r.test.n for r in self.rows)
        seeds = f"{fewest}" if fewest == most else f"{fewest}–{most}"
        return (
            f"width {self.wide_width} is not shown worse than {self.narrow_width} at any lr ({seeds} seeds; "
            f"upper 95 % bounds up to {top:+.2f} nats)"
        )


def _seed_pairs(directory: Path) -> Tuple[TransferSpec, int, int, Dict[float, Dict[int, tuple]]]:
    """(the arm's spec, narrow width, wide width, {lr: {seed: (narrow run's row, wide run's row)}}) for the seeds
    whose runs finished at both widths (diverged or not)."""
    if not (directory / SPEC_FILE).exists():
        raise ValueError(
            f"{directory} is not an arm's directory (no {SPEC_FILE}): pass the --dir of a transfer "
            "experiment (docs/mup/arms/<arm>)"
        )
    spec = open_experiment(directory, None, create=False)  # spec.json as the runner reads it, its errors included
    if len(spec.optimizers) != 1 or len(spec.parametrizations) != 1:
        raise ValueError(f"{directory}: an arm has one optimizer and one parametrization")
    results, (optimizer,), (parametrization,) = read_results(directory), spec.optimizers, spec.parametrizations
    narrow, wide = min(spec.widths), max(spec.widths)
    pairs = {}
    for lr in spec.lrs:
        pairs[lr] = {}
        for seed in spec.seeds:
            rows = tuple(results.get(Cell(optimizer, parametrization, w, lr, seed).name) for w in (narrow, wide))
            if all(rows):
                pairs[lr][seed] = rows
    return spec, narrow, wide, pairs


def _finite(pair: tuple) -> bool:
    return all(row["status"] != DIVERGED for row in pair)


def judge_arm(directory: Path) -> Arm:
    """The arm in `directory` (an experiment of one optimizer, one parametrization, two or more widths)."""
    spec, narrow, wide, pairs = _seed_pairs(directory)
    finite = {
        lr: [(a["val_loss"], b["val_loss"]) for a, b in seeds.values() if _finite((a, b))]
        for lr, seeds in pairs.items()
    }
    tests = {lr: paired_t([b for _, b in f], [a for a, _ in f]) for lr, f in finite.items() if len(f) >= 2}
    holm = dict(zip(tests, adjust([t.p for t in tests.values()])))
    rows = []
    for lr, seeds in pairs.items():
        diverged_wide = any(b["status"] == DIVERGED and a["status"] != DIVERGED for a, b in seeds.values())
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
        out += [
            f"#### `{arm.name}`: {arm.answer}",
            "",
            f"Settings: `{arm.settings}`.",
            "",
            f"| lr | seeds | loss at {arm.narrow_width} | loss at {arm.wide_width} | Δ ({arm.wide_width} − "
            f"{arm.narrow_width}) [95 % CI] | p (Holm) | call |",
            "|---:|---:|---:|---:|---|---:|---|",
        ]
        out += [_table_row(r.lr, f"{len(r.wide)}", r.narrow, r.wide, r.test, r.p_holm, r.call) for r in arm.rows]
        out.append("")
    return "\n".join(out)


@dataclass(frozen=True)
class GapRow:
    lr: float
    control: List[float]  # each paired seed's gap, L(wide) − L(narrow), in the control arm
    arm: List[float]  # the same seeds' gaps in the arm
    left_out: int  # seeds both arms finished at both widths, left out because one of their runs diverged
    test: Optional[TTest]  # arm − control; None under two seeds
    p_holm: float
    call: str


@dataclass(frozen=True)
class GapComparison:
    control: str
    arm: str
    rows: List[GapRow]
    narrow_width: int
    same_narrow: Tuple[int, int]  # (narrow-width runs ending at the control's loss exactly, runs both arms finished)

    @property
    def answer(self) -> str:
        moved = [
            f"{call} at lr " + ", ".join(f"{r.lr:.3g}" for r in self.rows if r.call == call)
            for call in (NARROWS, WIDENS)
            if any(r.call == call for r in self.rows)
        ]
        missing = sum(r.call == TOO_FEW for r in self.rows)
        if missing:
            moved.append(f"not yet: {missing} of {len(self.rows)} lrs have fewer than two seeds in both arms")
        return "; ".join(moved) or "no lr where it is shown to move the gap"


def paired_gaps(directories: Sequence[Path]) -> Tuple[TransferSpec, Dict[float, List[tuple]], Dict[float, int]]:
    """Arms of one experiment (same widths, lrs, seeds, optimizer): (the first's spec, {lr: [(each arm's gap,
    L(wide) − L(narrow)) for each seed every arm finished at both widths without a diverged run]}, {lr: seeds
    left out because a run of theirs diverged in some arm})."""
    specs, pairs = zip(*((spec, p) for spec, _, _, p in map(_seed_pairs, directories)))
    for directory, spec in zip(directories[1:], specs[1:]):
        if any(getattr(specs[0], k) != getattr(spec, k) for k in ("widths", "lrs", "seeds", "optimizers")):
            raise ValueError(
                f"{directory} and {directories[0]} are not arms of one experiment: their widths, lrs, "
                "seeds or optimizers differ"
            )
    gaps, left_out = {}, {}
    for lr in specs[0].lrs:
        every = sorted(set.intersection(*(set(p[lr]) for p in pairs)))
        kept = [s for s in every if all(_finite(p[lr][s]) for p in pairs)]
        gaps[lr] = [tuple(p[lr][s][1]["val_loss"] - p[lr][s][0]["val_loss"] for p in pairs) for s in kept]
        left_out[lr] = len(every) - len(kept)
    return specs[0], gaps, left_out


def same_narrow_runs(control: Path, arm: Path) -> Tuple[int, int]:
    """(how many of the narrow-width runs both arms finished end at exactly the same loss, how many both finished).
    An arm whose change is the identity at the narrow (base) width should match every one bit for bit: a
    mismatch means the arms also differ in something else — code, machine or kernels."""
    (_, _, _, pc), (_, _, _, pa) = _seed_pairs(control), _seed_pairs(arm)
    narrow = [(pc[lr][s][0], pa[lr][s][0]) for lr in pc for s in set(pc[lr]) & set(pa.get(lr, {}))]
    both = [(c, a) for c, a in narrow if c["status"] != DIVERGED and a["status"] != DIVERGED]
    return sum(c["val_loss"] == a["val_loss"] for c, a in both), len(both)


def compare_arms(control: Path, arm: Path) -> GapComparison:
    """Does `arm` change the wide width's gap to the narrow one, against `control` (same grid)?"""
    spec, gaps, left_out = paired_gaps([control, arm])
    tests = {lr: paired_t([a for _, a in g], [c for c, _ in g]) for lr, g in gaps.items() if len(g) >= 2}
    holm = dict(zip(tests, adjust([t.p for t in tests.values()])))
    rows = []
    for lr, g in gaps.items():
        test, p = tests.get(lr), holm.get(lr, math.nan)
        call = TOO_FEW if test is None else CANT_TELL if not p < ALPHA else WIDENS if test.delta > 0 else NARROWS
        rows.append(GapRow(lr, [c for c, _ in g], [a for _, a in g], left_out[lr], test, p, call))
    return GapComparison(control.name, arm.name, rows, min(spec.widths), same_narrow_runs(control, arm))


def comparisons_markdown(comparisons: Sequence[GapComparison]) -> str:
    """One table per arm against the control: each lr's gap in both, the paired difference and its call."""
    out = []
    for c in comparisons:
        out += [
            f"#### `{c.arm}` against `{c.control}`: {c.answer}",
            "",
            f"| lr | seeds | gap in `{c.control}` | gap in `{c.arm}` | Δ gap (arm − control) [95 % CI] | p (Holm) | "
            "call |",
            "|---:|---:|---:|---:|---|---:|---|",
        ]
        for r in c.rows:
            seeds = f"{len(r.arm)}" + (f" ({r.left_out} diverged, left out)" if r.left_out else "")
            out.append(_table_row(r.lr, seeds, r.control, r.arm, r.test, r.p_holm, r.call, sign="+"))
        same, both = c.same_narrow
        out += [
            "",
            f"At the narrow width {c.narrow_width}, {same} of the {both} runs both finished end at the control's loss to the "
            "last digit.",
            "",
        ]
    return "\n".join(out)


def _table_row(
    lr: float,
    seeds: str,
    first: List[float],
    second: List[float],
    test: Optional[TTest],
    p_holm: float,
    call: str,
    sign: str = "",
) -> str:
    """One lr's row: the two sides' means (one seed: its values and difference, no interval), second − first with its
    95 % interval, Holm's p and the call. `sign="+"` signs the sides' values (gaps, not losses)."""
    if test is None:
        values = (
            f"{first[0]:{sign}.4f} | {second[0]:{sign}.4f} | {second[0] - first[0]:+.4f} (one seed)"
            if second
            else " | | "
        )
        return f"| {lr:.3g} | {seeds} | {values} | | {call} |"
    d = decimals(test.half_width)
    return (
        f"| {lr:.3g} | {seeds} | {statistics.fmean(first):{sign}.4f} | {statistics.fmean(second):{sign}.4f} | "
        f"{test.delta:+.{d}f} [{test.low:+.{d}f}, {test.high:+.{d}f}] | {format_p(p_holm)} | {call} |"
    )
