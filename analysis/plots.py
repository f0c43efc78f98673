"""Curves per variant: validation loss over training and against wall-clock time, per-layer residual-stream RMS;
and the paired-Δ forest plot against the reference."""

import math
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import matplotlib
import numpy as np
from matplotlib.figure import Figure

from analysis.runs import Variant
from analysis.stats import CI, TTest


def colours(variants: Sequence[Variant]) -> Dict[str, tuple]:
    """One colour per variant, by sorted label, so a variant keeps its colour in every figure."""
    cmap = matplotlib.colormaps["tab10"]
    return {label: cmap(i % 10) for i, label in enumerate(sorted(v.label for v in variants))}


def _aligned(variant: Variant, key: str, pick: Callable = lambda value: value):
    """(tokens, values of shape (seeds, evals)) over the eval steps that every seed logged `key` at."""
    steps = sorted(set.intersection(*({e["step"] for e in r.evals if key in e} for r in variant.runs)))
    per_run = [{e["step"]: e for e in r.evals} for r in variant.runs]
    tokens = np.array([per_run[0][s]["tokens"] for s in steps], dtype=float)
    return tokens, np.array([[pick(evals[s][key]) for s in steps] for evals in per_run], dtype=float)


def _band(ax, x, values, colour, label):
    """Mean over seeds as a line, min–max over seeds shaded (no band with a single seed)."""
    ax.plot(x, values.mean(axis=0), color=colour, label=f"{label} (n={len(values)})", lw=1.8)
    if len(values) > 1:
        ax.fill_between(x, values.min(axis=0), values.max(axis=0), color=colour, alpha=0.2, lw=0)
    return values


def _token_unit(end: float) -> tuple:
    return (1e6, "M") if end >= 1e6 else (1e3, "K")


def plot_val_curves(variants: Sequence[Variant], path: Path) -> None:
    """Left: whole run. Right: the second half zoomed, where variants separate."""
    fig, (full, zoom) = figure(1, 2, figsize=(12, 4.5))
    palette = colours(variants)
    curves = {v.label: _aligned(v, "val_loss") for v in variants}
    end = max(tokens[-1] for tokens, _ in curves.values())
    # The zoom's y-range covers only the second half, where the differences live.
    tails = np.concatenate([loss[:, tokens >= end / 2].ravel() for tokens, loss in curves.values()])
    scale, unit = _token_unit(end)
    for label, (tokens, loss) in curves.items():
        for ax in (full, zoom):
            _band(ax, tokens / scale, loss, palette[label], label)
    pad = 0.05 * (tails.max() - tails.min()) + 1e-6
    zoom.set_ylim(tails.min() - pad, tails.max() + pad)
    zoom.set_xlim(end / 2 / scale, end / scale)
    full.set_title("validation loss (mean over seeds, min–max shaded)")
    zoom.set_title("second half of training, zoomed")
    for ax in (full, zoom):
        ax.set_xlabel(f"training tokens ({unit})")
        ax.set_ylabel("val loss (nats/token)")
        ax.grid(alpha=0.3)
    legend_below(fig, full)
    save(fig, path)


def plot_time_to_quality(variants: Sequence[Variant], path: Path) -> None:
    """Validation bpb against wall-clock seconds of the training loop, one line per run (seeds of a variant share
    its colour): what a user with N minutes gets. Left whole, right the second half of the time zoomed."""
    fig, (full, zoom) = figure(1, 2, figsize=(12, 4.5))
    palette = colours(variants)
    curves = [(v.label, np.array(r.eval_seconds(), dtype=float)) for v in variants for r in v.runs if r.eval_seconds()]
    end = max(curve[-1, 0] for _, curve in curves)
    tails = np.concatenate([curve[curve[:, 0] >= end / 2, 1] for _, curve in curves])
    for ax in (full, zoom):
        named = set()
        for label, curve in curves:
            ax.plot(
                curve[:, 0],
                curve[:, 1],
                color=palette[label],
                marker=".",
                lw=1.4,
                label=None if label in named else label,
            )
            named.add(label)
        ax.set_xlabel("wall-clock seconds of the training loop (compilation and evaluations included)")
        ax.set_ylabel("validation bits per byte")
        ax.grid(alpha=0.3)
    if len(tails):
        pad = 0.05 * (tails.max() - tails.min()) + 1e-6
        zoom.set_ylim(tails.min() - pad, tails.max() + pad)
    zoom.set_xlim(end / 2, end * 1.02)
    full.set_title("validation bpb against time (one line per run)")
    zoom.set_title("second half of the time, zoomed")
    legend_below(fig, full)
    save(fig, path)


def has_activation_rms(variants: Sequence[Variant]) -> bool:
    return all(r.evals and "rms_residual" in r.final for v in variants for r in v.runs)


def plot_activation_rms(variants: Sequence[Variant], path: Path) -> None:
    """Left: residual RMS after each block at the final eval. Right: the last block's over training."""
    fig, (layers, time) = figure(1, 2, figsize=(12, 4.5))
    palette = colours(variants)
    curves = {v.label: _aligned(v, "rms_residual", pick=lambda per_layer: per_layer[-1]) for v in variants}
    scale, unit = _token_unit(max(tokens[-1] for tokens, _ in curves.values()))
    plotted = {layers: [], time: []}
    for v in variants:
        per_layer = np.array([r.final["rms_residual"] for r in v.runs], dtype=float)  # (seeds, layers)
        plotted[layers].append(_band(layers, np.arange(per_layer.shape[1]), per_layer, palette[v.label], v.label))
        tokens, last = curves[v.label]
        plotted[time].append(_band(time, tokens / scale, last, palette[v.label], v.label))
    layers.set_xlabel("block (residual stream after it)")
    layers.set_title("hidden-state RMS per layer, final eval")
    time.set_xlabel(f"training tokens ({unit})")
    time.set_title("hidden-state RMS after the last block, over training")
    for ax, arrays in plotted.items():
        ax.set_ylabel("RMS")
        ax.grid(alpha=0.3)
        values = np.concatenate([a.ravel() for a in arrays])
        if values.min() > 0 and values.max() / values.min() > 20:  # scales far apart: log shows them all
            ax.set_yscale("log")
    layers.xaxis.get_major_locator().set_params(integer=True)
    legend_below(fig, layers)
    save(fig, path)


def legend_below(fig: Figure, ax) -> None:
    """The variants' legend under the panels, in up to three columns: inside a panel, beyond three variants it
    covers the curves it names."""
    handles, labels = ax.get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, 0.0),
        ncol=min(3, len(labels)),
        frameon=False,
        fontsize=9,
    )


def figure(rows: int = 1, cols: int = 1, **kwargs) -> tuple:
    """(figure, its axes) drawn off-screen: a Figure of its own, no pyplot state and no GUI backend,
    so it works on a headless machine and in tests, and nothing stays open after save()."""
    fig = Figure(figsize=kwargs.pop("figsize", None))
    return fig, fig.subplots(rows, cols, **kwargs)


def save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")  # tight: a legend below the panels is kept


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
    shifts = _offsets(len(groups))
    for (name, rows), offset, marker in zip(groups.items(), shifts, MARKERS):
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


def _offsets(n: int) -> List[float]:
    """Vertical offsets that keep n markers of one row apart (0 for a single group)."""
    return [0.0] if n <= 1 else [(i - (n - 1) / 2) * 0.5 / n for i in range(n)]
