"""The μP figures: activation RMS against width per training step (the coordinate check), final
validation loss against the learning rate, one curve per width (the transfer experiment, as Figure 1 of
Tensor Programs V), SP and μP side by side in both."""

from pathlib import Path
from typing import Dict, Optional, Sequence

import matplotlib

from analysis.plots import figure, save
from lab.mup.coord_check import ATTENTION_LOGITS, LAYERS, CoordResult

NAMES = {"sp": "SP", "mup": "μP", "adamw": "AdamW", "muon": "Muon"}


def plot_coord_check(results: Sequence[CoordResult], path: Path) -> None:
    """One column per (optimizer, parametrization), one row per layer kind; x width, y RMS (both log),
    one line per step from init (light) to the last (dark). Rows share their y-axis: SP's growth and
    μP's flat lines are read against the same scale."""
    rows = (*LAYERS, ATTENTION_LOGITS)
    fig, axes = figure(
        len(rows), len(results), figsize=(3.6 * len(results), 2.8 * len(rows)), squeeze=False, sharey="row"
    )
    for col, result in enumerate(results):
        widths, steps = result.setup.widths, result.setup.steps
        slopes = result.slopes()
        for row, layer in enumerate(rows):
            ax = axes[row][col]
            for t, values in enumerate(result.rms[layer]):
                ax.plot(
                    widths,
                    values,
                    marker="o",
                    ms=3,
                    color=matplotlib.colormaps["viridis"](t / max(steps, 1)),
                    label=f"t={t}" if t in (0, steps) else None,
                )
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(
                f"{NAMES[result.setup.optimizer]} · {NAMES[result.parametrization]}: {layer} "
                f"(slope {slopes[layer]:+.2f})",
                fontsize=9,
            )
            ax.grid(alpha=0.3)
            if row == len(rows) - 1:
                ax.set_xlabel("width (hidden_size)")
            if col == 0:
                ax.set_ylabel("activation RMS")
            if row == 0 and col == 0:
                ax.legend(fontsize=7)
    save(fig, path)


def plot_transfer(losses: Dict[tuple, Dict[int, Dict[float, Optional[float]]]], path: Path) -> None:
    """losses[(optimizer, parametrization)][width][lr] = final val loss (mean over seeds; None = diverged).
    One row per optimizer, SP left and μP right; a diverged point is an × on the panel's top edge, each
    width's best lr a ring. Under μP the rings line up; under SP they drift as the model widens."""
    optimizers = sorted({o for o, _ in losses})
    fig, axes = figure(len(optimizers), 2, figsize=(11, 4.2 * len(optimizers)), squeeze=False, sharey="row")
    for row, optimizer in enumerate(optimizers):
        for col, parametrization in enumerate(("sp", "mup")):
            _lr_curves(axes[row][col], losses.get((optimizer, parametrization), {}))
            axes[row][col].set_title(f"{NAMES[optimizer]} · {NAMES[parametrization]}")
    save(fig, path)


def _lr_curves(ax, per_width: Dict[int, Dict[float, Optional[float]]]) -> None:
    finite = [v for per_lr in per_width.values() for v in per_lr.values() if v is not None]
    top = max(finite) if finite else 1.0
    cmap = matplotlib.colormaps["plasma"]
    for i, (width, per_lr) in enumerate(sorted(per_width.items())):
        colour = cmap(i / max(len(per_width), 2))
        ok = sorted((lr, v) for lr, v in per_lr.items() if v is not None)
        if ok:
            ax.plot(*zip(*ok), marker="o", color=colour, label=f"width {width}")
            best = min(ok, key=lambda point: point[1])
            ax.scatter(*best, s=150, facecolors="none", edgecolors=colour, lw=2)
        bad = [lr for lr, v in per_lr.items() if v is None]
        ax.scatter(bad, [top] * len(bad), marker="x", s=60, color=colour, clip_on=False)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("peak learning rate (optim.lr)")
    ax.set_ylabel("final validation loss (nats/token)")
    ax.grid(alpha=0.3)
    if per_width:  # a panel of a parametrization the plan left out stays empty
        ax.legend(fontsize=8)


def plot_schedules(along: Dict[tuple, Dict[int, dict]], quantities: Dict[str, str], path: Path) -> None:
    """along[(optimizer, parametrization)][width] = {"step": [...], quantity: [...]}: one row per optimizer and
    parametrization, one panel per quantity against the step, one line per width (log scale: under μP the
    widths' lines should lie on each other)."""
    keys = sorted(along)
    fig, axes = figure(len(keys), len(quantities), figsize=(5.5 * len(quantities), 3.8 * len(keys)), squeeze=False)
    cmap = matplotlib.colormaps["plasma"]
    for row, key in enumerate(keys):
        for col, (quantity, label) in enumerate(quantities.items()):
            ax = axes[row][col]
            for i, (width, series) in enumerate(sorted(along[key].items())):
                if quantity in series:
                    ax.plot(
                        series["step"],
                        series[quantity],
                        marker="o",
                        color=cmap(i / max(len(along[key]), 2)),
                        label=f"width {width} (lr {series['lr']:.3g})",
                    )
            ax.set_yscale("log")
            ax.set_xlabel("step")
            ax.set_title(f"{NAMES[key[0]]} · {NAMES[key[1]]}: {label}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    save(fig, path)
