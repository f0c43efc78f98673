"""Figures of differences against the reference: the paired-Δ forest plot and Δ against model size."""

import math
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

from analysis.plots import figure, save
from analysis.stats import CI, TTest

MARKERS = "osD^vP*X"


ForestRow = Tuple[str, Optional[TTest], str]  # (variant, its paired test vs the reference, its verdict's outcome)
COLOURS = {"better": "tab:green", "worse": "tab:red", "equivalent": "tab:blue"}  # anything else: grey


def plot_forest(
    groups: Dict[str, Sequence[ForestRow]], path: Path, reference: str = "reference", unit: str = "bpb"
) -> None:
    """One row per variant: its paired Δ vs the reference with the 95 % CI, one marker per group
    (model size), coloured by its verdict; a dashed line at 0 (no difference). Left of it = the variant
    is better."""
    labels = list(dict.fromkeys(label for rows in groups.values() for label, _, _ in rows))
    fig, ax = figure(figsize=(8, 1.2 + 0.55 * len(labels) * max(1, len(groups)) ** 0.5))
    offsets = _offsets(len(groups))
    for (name, rows), offset, marker in zip(groups.items(), offsets, MARKERS):
        ys, xs, errors, colours = [], [], [[], []], []
        for label, t, outcome in rows:
            if t is None:
                continue
            ys.append(labels.index(label) + offset)
            xs.append(t.delta)
            lo, hi = (0.0, 0.0) if math.isnan(t.low) else (t.delta - t.low, t.high - t.delta)
            errors[0].append(lo)
            errors[1].append(hi)
            colours.append(COLOURS.get(outcome, "tab:grey"))
        ax.errorbar(xs, ys, xerr=errors, fmt="none", ecolor="0.35", capsize=3, lw=1.2)
        ax.scatter(xs, ys, c=colours, marker=marker, zorder=3, label=name or None)
    ax.axvline(0, color="k", ls="--", lw=1)
    ax.set_yticks(range(len(labels)), labels)
    ax.invert_yaxis()
    ax.set_xlabel(f"Δ final val {unit} vs {reference}  (← variant better · worse →), {CI}")
    ax.set_title("paired difference per variant (green: better, red: worse, blue: equivalent, grey: can't tell)")
    ax.grid(axis="x", alpha=0.3)
    if len(groups) > 1:
        ax.legend(title="size", loc="best")
    save(fig, path)


def plot_delta_vs_size(
    sizes: Sequence[Tuple[str, int]],
    deltas: Dict[str, List[Optional[TTest]]],
    path: Path,
    reference: str,
    unit: str = "bpb",
) -> None:
    """Δ (with its CI) of each variant against the reference at each size; x = the reference's
    parameter count (log scale), labelled with the size's name."""
    fig, ax = figure(figsize=(8, 4.8))
    params = [n for _, n in sizes]
    cmap = matplotlib.colormaps["tab10"]
    plotted = 0
    for i, (label, tests) in enumerate(sorted(deltas.items())):
        points = [(x, t) for x, t in zip(params, tests) if t is not None]
        if not points:
            continue
        plotted += 1
        xs = [x * (1 + 0.02 * (i - len(deltas) / 2)) for x, _ in points]  # spread markers apart
        ys = [t.delta for _, t in points]
        errors = [
            [0.0 if math.isnan(t.low) else t.delta - t.low for _, t in points],
            [0.0 if math.isnan(t.high) else t.high - t.delta for _, t in points],
        ]
        ax.errorbar(xs, ys, yerr=errors, marker="o", capsize=3, color=cmap(i % 10), label=label)
    ax.axhline(0, color="k", ls="--", lw=1)
    ax.set_xscale("log")
    ax.set_xticks(params, [f"{name}\n{n / 1e6:.2f}M" for name, n in sizes])
    ax.minorticks_off()
    ax.set_xlabel("model size (reference's parameters)")
    ax.set_ylabel(f"Δ final val {unit} vs {reference}")
    ax.set_title(f"does the difference hold at scale? (paired Δ, {CI}; below 0 = better)")
    ax.grid(alpha=0.3)
    if plotted:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no variant has two paired seeds at any size yet", ha="center", transform=ax.transAxes)
    save(fig, path)


def _offsets(n: int) -> List[float]:
    """Vertical offsets that keep n markers of one row apart (0 for a single group)."""
    return [0.0] if n <= 1 else [(i - (n - 1) / 2) * 0.5 / n for i in range(n)]
