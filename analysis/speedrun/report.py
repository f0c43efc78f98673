"""The speedrun's report: every recipe's full-split bits per byte at the same wall-clock budget,
judged against the reference with paired seed statistics, and the winners against each other."""
import itertools
import math
from typing import Dict, List

from analysis.speedrun.spec import Spec
from analysis.stats import CI, compare, decimals, format_p, summarize

Results = Dict[str, Dict[int, dict]]  # recipe → seed → its result.json


def report(spec: Spec, results: Results, calibrations: Dict[str, dict], machine: str) -> str:
    """Markdown: the table, the winners' pairwise comparisons, and the runs to distrust."""
    done = {name: runs for name, runs in results.items() if runs}
    lines = [f"# Speedrun: {spec.budget_s:g} s of training loop per run", "",
             f"{machine}. Bits per byte by scripts/evaluate.py on the whole validation split; Δ = recipe − "
             f"{spec.reference}, paired by seed ({CI}, Student t); lower is better.", "",
             "| recipe | overrides | steps | tokens/run | loop s (worst miss) | tokens/s | bpb per seed | bpb mean ± std "
             f"| Δ vs {spec.reference} | p | verdict | loop time vs {spec.reference} |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    reference = done.get(spec.reference, {})
    outcomes = {}
    for name in spec.recipes:
        runs = done.get(name)
        if not runs:
            steps = calibrations.get(name, {}).get("max_steps", "?")
            lines.append(f"| {name} | {_overrides(spec.recipes[name])} | {steps} | | | | not run yet | | | | | |")
            continue
        lines.append(_row(name, spec, runs, reference, outcomes))
    lines += _winners(spec, done, outcomes)
    lines += _flagged(done)
    return "\n".join(lines) + "\n"


def _row(name: str, spec: Spec, runs: Dict[int, dict], reference: Dict[int, dict], outcomes: dict) -> str:
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
        comparison = compare({s: runs[s]["bpb"] for s in seeds}, {s: r["bpb"] for s, r in reference.items()})
        time = _time_vs_reference(runs, reference, spec.tolerance)
        outcomes[name] = comparison.outcome
        t = comparison.test
        if t is None or math.isnan(t.low):
            delta = f"{comparison.paired.delta:+.4f} (1 seed)" if comparison.paired else "—"
            p = "n/a"
        else:
            d = decimals(t.half_width)
            delta = f"{t.delta:+.{d}f} [{t.low:+.{d}f}, {t.high:+.{d}f}]"
            p = format_p(t.p)
        verdict = comparison.verdict()
    return (f"| {name} | {_overrides(spec.recipes[name])} | {first['max_steps']} | {first['tokens']:,} | "
            f"{sum(loop) / len(loop):.0f} ({worst:+.1%}) | {tps:,.0f} | {per_seed} | {summary.mean:.4f}{spread} | "
            f"{delta} | {p} | {verdict} | {time} |")


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
