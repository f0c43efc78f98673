"""The transfer experiment's report: final validation loss per optimizer, parametrization, width and lr
(mean over seeds), each width's best lr and how far it moves across the ladder — under μP it should
stay put, under SP drift down as the model widens — as results.md and transfer.png."""
import math
import statistics
from pathlib import Path
from typing import Dict, Optional

from studies.mup.plots import NAMES, plot_transfer
from studies.mup.transfer import DIVERGED, Cell, TransferSpec, read_results

Losses = Dict[tuple, Dict[int, Dict[float, Optional[float]]]]  # [(optimizer, parametrization)][width][lr]


def mean_losses(spec: TransferSpec, results: Dict[str, dict]) -> Losses:
    """Mean final val loss over the seeds recorded so far; None when any seed diverged; a point with no
    seed recorded yet is left out."""
    losses: Losses = {}
    for optimizer in spec.optimizers:
        for parametrization in spec.parametrizations:
            for width in spec.widths:
                for lr in spec.lrs:
                    names = [Cell(optimizer, parametrization, width, lr, s).name for s in spec.seeds]
                    rows = [results[name] for name in names if name in results]
                    if rows:
                        value = None if any(r["status"] == DIVERGED for r in rows) else \
                            statistics.fmean(r["val_loss"] for r in rows)
                        losses.setdefault((optimizer, parametrization), {}).setdefault(width, {})[lr] = value
    return losses


def best_lrs(losses: Losses) -> Dict[tuple, Dict[int, float]]:
    """Each width's lr with the lowest mean loss (widths where every lr diverged are left out)."""
    best = {}
    for key, per_width in losses.items():
        for width, per_lr in per_width.items():
            finite = {lr: v for lr, v in per_lr.items() if v is not None}
            if finite:
                best.setdefault(key, {})[width] = min(finite, key=finite.get)
    return best


def drift(best: Dict[int, float]) -> float:
    """log2(best lr at the widest width / at the narrowest): 0 = transfers; -3 = moved 8× down."""
    return math.log2(best[max(best)] / best[min(best)])


def markdown(spec: TransferSpec, losses: Losses) -> str:
    best = best_lrs(losses)
    out = [f"# μP learning-rate transfer: final validation loss (nats/token), mean over seeds {list(spec.seeds)}",
           "", "Bold: each width's best lr. ×: diverged (any seed). Blank: not run yet.", ""]
    for key in sorted(losses, key=lambda k: (k[0], k[1] != "sp")):  # SP, then μP, per optimizer
        optimizer, parametrization = key
        moved = f"best lr moved 2^{drift(best[key]):+.0f} from width {min(best[key])} to {max(best[key])}" \
            if len(best.get(key, {})) > 1 else "best lr: too few widths finished"
        edges = [w for w, lr in sorted(best.get(key, {}).items()) if lr in (min(spec.lrs), max(spec.lrs))]
        if edges:  # the optimum may lie past the grid: the move shown is then a bound, not a measurement
            moved += f" (at the grid's edge at width {', '.join(map(str, edges))}: the optimum may lie beyond it)"
        out += [f"## {NAMES[optimizer]} · {NAMES[parametrization]}: {moved}", "",
                "| width | " + " | ".join(f"lr {lr:.3g}" for lr in spec.lrs) + " | best lr |",
                "|---:|" + "---:|" * (len(spec.lrs) + 1)]
        for width, per_lr in sorted(losses[key].items()):
            cells = [_cell(per_lr, lr, best[key].get(width)) for lr in spec.lrs]
            best_lr = best[key].get(width)
            out.append(f"| {width} | " + " | ".join(cells) + f" | {'' if best_lr is None else f'{best_lr:.3g}'} |")
        out.append("")
    return "\n".join(out)


def _cell(per_lr: Dict[float, Optional[float]], lr: float, best: Optional[float]) -> str:
    if per_lr.get(lr) is None:
        return "×" if lr in per_lr else ""  # diverged, or not run yet
    return f"**{per_lr[lr]:.4f}**" if lr == best else f"{per_lr[lr]:.4f}"


def write_report(spec: TransferSpec, directory: Path) -> tuple:
    """results.md and transfer.png in the experiment directory, from whatever has finished."""
    losses = mean_losses(spec, read_results(directory))
    if not losses:
        raise ValueError(f"{directory} has no finished runs to report yet")
    table, figure = directory / "results.md", directory / "transfer.png"
    table.write_text(markdown(spec, losses))
    plot_transfer(losses, figure)
    return table, figure
