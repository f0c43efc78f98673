"""The speedrun's report: every recipe's full-split bits per byte at the same wall-clock budget,
judged against the reference with paired seed statistics, and the winners against each other. A verdict
needs 3 paired seeds of its own, or a pooled spread: with 2 seeds (1 degree of freedom) the recipe's
paired differences are judged against the sd of every recipe's paired differences pooled (stated)."""

import itertools
from typing import Dict, List, Optional

from analysis.stats import CI, TTest, compare, decimals, format_p, p_text, paired_t, pooled_paired_t, summarize
from lab import power
from lab.looks import alpha_for
from lab.speedrun.spec import Spec

MIN_OWN_SEEDS = 3  # a paired test on its own spread from 3 seeds (2 dof); with fewer, the pooled spread
ALPHA = 0.05

Results = Dict[str, Dict[int, dict]]  # recipe → seed → its result.json


def report(spec: Spec, results: Results, calibrations: Dict[str, dict], machine: str, looks=()) -> str:
    """Markdown: the table, the winners' pairwise comparisons, and the runs to distrust. looks: the
    campaign's recorded looks (analysis/looks.py): a sequential one splits α over them."""
    done = {name: runs for name, runs in results.items() if runs}
    pooled = _pooled(spec, done)
    lines = [
        f"# Speedrun: {spec.budget_s:g} s of training loop per run",
        "",
        f"{machine}. Bits per byte by scripts/evaluate.py on the whole validation split; Δ = recipe − "
        f"{spec.reference}, paired by seed ({CI}, Student t); lower is better.",
        "",
        "| recipe | overrides | steps | tokens/run | loop s (worst miss) | tokens/s | bpb per seed | bpb mean ± std "
        f"| Δ vs {spec.reference} | p | verdict | loop time vs {spec.reference} |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    reference = done.get(spec.reference, {})
    outcomes = {}
    for name in spec.recipes:
        runs = done.get(name)
        if not runs:
            steps = calibrations.get(name, {}).get("max_steps", "?")
            lines.append(f"| {name} | {_overrides(spec.recipes[name])} | {steps} | | | | not run yet | | | | | |")
            continue
        lines.append(_row(name, spec, runs, reference, outcomes, pooled, alpha_for(ALPHA, list(looks), name)))
    lines += _method(pooled)
    lines += _winners(spec, done, outcomes)
    lines += _flagged(done)
    return "\n".join(lines) + "\n"


def _row(
    name: str,
    spec: Spec,
    runs: Dict[int, dict],
    reference: Dict[int, dict],
    outcomes: dict,
    pooled: Optional[tuple],
    level: tuple,
) -> str:
    seeds = sorted(runs)
    bpbs = [runs[s]["bpb"] for s in seeds]
    summary = summarize(bpbs)
    loop = [runs[s]["loop_s"] for s in seeds]
    worst = max((runs[s]["loop_s"] / spec.budget_s - 1 for s in seeds), key=abs)
    tps = sum(runs[s]["tokens_per_s"] for s in seeds) / len(seeds)
    first = runs[seeds[0]]
    per_seed = ", ".join(f"{runs[s]['bpb']:.4f}" + ("⚠" if runs[s].get("flags") else "") for s in seeds)
    spread = f" ± {summary.std:.4f}" if summary.n > 1 else ""
    if name == spec.reference:
        delta = p = verdict = time = "—"
    else:
        time = _time_vs_reference(runs, reference, spec.tolerance)
        delta, p, verdict, outcomes[name] = _judge(runs, reference, pooled, level)
    return (
        f"| {name} | {_overrides(spec.recipes[name])} | {first['max_steps']} | {first['tokens']:,} | "
        f"{sum(loop) / len(loop):.0f} ({worst:+.1%}) | {tps:,.0f} | {per_seed} | {summary.mean:.4f}{spread} | "
        f"{delta} | {p} | {verdict} | {time} |"
    )


def _pooled(spec: Spec, done: Results) -> Optional[tuple]:
    """(sd, dof, recipes) of every recipe's paired differences with the reference, each about its own mean."""
    reference = done.get(spec.reference, {})
    diffs = {
        name: [runs[s]["bpb"] - reference[s]["bpb"] for s in sorted(set(runs) & set(reference))]
        for name, runs in done.items()
        if name != spec.reference
    }
    sd = power.pooled_sd(diffs)
    return None if sd is None else (sd, power.pooled_dof(diffs), sorted(n for n, d in diffs.items() if len(d) >= 2))


def _judge(runs: Dict[int, dict], reference: Dict[int, dict], pooled: Optional[tuple], level: tuple) -> tuple:
    """(Δ cell, p cell, verdict sentence, outcome) of a recipe against the reference at (α, looks)."""
    seeds = sorted(set(runs) & set(reference))
    a, b = [runs[s]["bpb"] for s in seeds], [reference[s]["bpb"] for s in seeds]
    if len(seeds) < 2:
        one = f"{a[0] - b[0]:+.4f} (1 seed)" if seeds else "—"
        return one, "n/a", f"no verdict: {len(seeds)} paired seed(s); a test needs at least 2", "none"
    own = len(seeds) >= MIN_OWN_SEEDS
    if not own and (pooled is None or pooled[1] < 2):
        t = paired_t(a, b)
        return (
            _delta(t),
            "n/a",
            (
                f"no verdict: {len(seeds)} paired seeds (1 dof) and no pooled spread of 2+ dof; "
                f"run a third seed of both or more recipes"
            ),
            "none",
        )
    t = paired_t(a, b) if own else pooled_paired_t(a, b, pooled[0], pooled[1])
    alpha, k = level
    basis = f"{len(seeds)} paired seeds" + ("" if own else f", pooled sd {pooled[0]:.4f} ({pooled[1]} dof)")
    basis += f", α = {alpha:.3g} over {k} looks" if k > 1 else ""
    outcome = "unclear" if t.p >= alpha else ("better" if t.delta < 0 else "worse")
    d = decimals(t.half_width)
    if outcome == "unclear":
        sentence = f"can't tell: Δ = {t.delta:+.{d}f} ± {t.half_width:.{d}f} bpb ({CI}), {p_text(t.p)}, {basis}"
    else:
        sentence = f"{outcome} by {abs(t.delta):.{d}f} ± {t.half_width:.{d}f} bpb ({CI}), {p_text(t.p)}, {basis}"
    return _delta(t), format_p(t.p), sentence, outcome


def _delta(t: TTest) -> str:
    if t.zero_spread:
        return f"{t.delta:+.4f} (no spread)"
    d = decimals(t.half_width)
    return f"{t.delta:+.{d}f} [{t.low:+.{d}f}, {t.high:+.{d}f}]"


def _method(pooled: Optional[tuple]) -> List[str]:
    lines = [
        "",
        f"Verdicts: a paired t-test on a recipe's own seeds from {MIN_OWN_SEEDS} paired seeds; with 2, "
        "against the pooled sd of every recipe's per-seed differences with the reference",
    ]
    if pooled:
        lines[-1] += f" (here {pooled[0]:.4f} bpb, {pooled[1]} dof, from {', '.join(pooled[2])})"
    lines[-1] += (
        ". α = 0.05 per recipe (no adjustment across recipes); seeds added after a look only under "
        "--sequential, which judges at α / looks."
    )
    return lines


def _time_vs_reference(runs: Dict[int, dict], reference: Dict[int, dict], tolerance: float) -> str:
    """Mean loop time over the paired seeds relative to the reference's. Fixed step counts land near the
    budget, not on it (a noisy machine, a short probe): a recipe that wins with more time than the
    reference beyond the tolerance may owe its win to that time, and is marked."""
    paired = [s for s in runs if s in reference]
    if not paired:
        return "—"
    ratio = sum(runs[s]["loop_s"] for s in paired) / sum(reference[s]["loop_s"] for s in paired) - 1
    return f"{ratio:+.1%}" + (" ⚠ more time" if ratio > tolerance else "")


def _winners(spec: Spec, done: Results, outcomes: dict) -> List[str]:
    """Each pair of recipes that beat the reference, against each other (same seeds, paired)."""
    winners = [name for name in spec.recipes if outcomes.get(name) == "better"]
    if len(winners) < 2:
        return []
    lines = ["", "Winners against each other (Δ = first − second, paired by seed):", ""]
    for a, b in itertools.combinations(winners, 2):
        comparison = compare({s: r["bpb"] for s, r in done[a].items()}, {s: r["bpb"] for s, r in done[b].items()})
        if comparison.paired is not None and comparison.paired.n < MIN_OWN_SEEDS:
            lines.append(
                f"- {a} vs {b}: no verdict on {comparison.paired.n} paired seeds (needs {MIN_OWN_SEEDS}); "
                f"Δ = {comparison.paired.delta:+.4f}"
            )
        else:
            lines.append(f"- {a} vs {b}: {comparison.verdict()}")
    return lines


def _flagged(done: Results) -> List[str]:
    flagged = [(name, seed, r) for name, runs in done.items() for seed, r in sorted(runs.items()) if r.get("flags")]
    if not flagged:
        return []
    lines = ["", "⚠ Runs to distrust (rerun them with --redo-flagged):", ""]
    lines += [f"- {name} seed {seed}: {'; '.join(r['flags'])}" for name, seed, r in flagged]
    return lines


def _overrides(overrides: List[str]) -> str:
    return " ".join(f"`{o}`" for o in overrides) if overrides else "(defaults)"
