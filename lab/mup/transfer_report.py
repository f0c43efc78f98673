"""The transfer experiment's report: final validation loss per optimizer, parametrization, width and lr
(mean over seeds), each width's best lr and how far it moves across the ladder — under μP it should
stay put, under SP drift down as the model widens — as results.md and transfer.png; and, where the runs
recorded them, the attention logits' RMS and each block's weight change along the schedule at each width's
best lr (schedule.png): what μP's scales are meant to keep independent of width."""

import math
import statistics
from pathlib import Path
from typing import Dict, Optional

from lab.mup.plots import NAMES, plot_schedules, plot_transfer
from lab.mup.transfer import DIVERGED, Cell, TransferSpec, read_results

Losses = Dict[tuple, Dict[int, Dict[float, Optional[float]]]]  # [(optimizer, parametrization)][width][lr]
Schedules = Dict[tuple, Dict[int, dict]]  # [(optimizer, parametrization)][width] = {"lr", "step", quantity: [...]}
QUANTITIES = {"attn_logits": "attention-logit RMS", "weight_change": "weight change since the last eval"}


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
                        value = (
                            None
                            if any(r["status"] == DIVERGED for r in rows)
                            else statistics.fmean(r["val_loss"] for r in rows)
                        )
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
    out = [
        f"# μP learning-rate transfer: final validation loss (nats/token), mean over seeds {list(spec.seeds)}",
        "",
        "Bold: each width's best lr. ×: diverged (any seed). Blank: not run yet.",
        "",
    ]
    for key in sorted(losses, key=lambda k: (k[0], k[1] != "sp")):  # SP, then μP, per optimizer
        optimizer, parametrization = key
        moved = (
            f"best lr moved 2^{drift(best[key]):+.0f} from width {min(best[key])} to {max(best[key])}"
            if len(best.get(key, {})) > 1
            else "best lr: too few widths finished"
        )
        edges = [w for w, lr in sorted(best.get(key, {}).items()) if lr in (min(spec.lrs), max(spec.lrs))]
        if edges:  # the optimum may lie past the grid: the move shown is then a bound, not a measurement
            moved += f" (at the grid's edge at width {', '.join(map(str, edges))}: the optimum may lie beyond it)"
        out += [
            f"## {NAMES[optimizer]} · {NAMES[parametrization]}: {moved}",
            "",
            "| width | " + " | ".join(f"lr {lr:.3g}" for lr in spec.lrs) + " | best lr |",
            "|---:|" + "---:|" * (len(spec.lrs) + 1),
        ]
        for width, per_lr in sorted(losses[key].items()):
            cells = [_cell(per_lr, lr, best[key].get(width)) for lr in spec.lrs]
            best_lr = best[key].get(width)
            out.append(f"| {width} | " + " | ".join(cells) + f" | {'' if best_lr is None else f'{best_lr:.3g}'} |")
        out.append("")
    return "\n".join(out)


def schedules(spec: TransferSpec, results: Dict[str, dict], losses: Losses) -> Schedules:
    """At each width's best lr, each evaluation's attention-logit RMS and weight change, averaged over the layers
    and then over the seeds that recorded them (results rows with a "schedule"); widths without any left out."""
    out: Schedules = {}
    for key, per_width in best_lrs(losses).items():
        for width, lr in per_width.items():
            rows = [results.get(Cell(*key, width, lr, s).name, {}).get("schedule") for s in spec.seeds]
            rows = [r for r in rows if r]
            if not rows or any(r["step"] != rows[0]["step"] for r in rows):
                continue
            along = {"lr": lr, "step": rows[0]["step"]}
            for quantity in QUANTITIES:
                if all(quantity in r for r in rows):
                    along[quantity] = [
                        statistics.fmean(statistics.fmean(r[quantity][i]) for r in rows)
                        for i in range(len(along["step"]))
                    ]
            out.setdefault(key, {})[width] = along
    return out


def schedule_markdown(along: Schedules) -> str:
    out = [
        "## Along the schedule, at each width's best lr",
        "",
        "Each evaluation's value, averaged over the layers and the seeds: the attention logits' RMS (q·kᵀ × "
        "scale on the first validation sequence) and each block's relative weight change since the previous "
        "evaluation (|W − W_prev| / |W_prev|; the first: since initialisation).",
        "",
    ]
    for key, per_width in sorted(along.items()):
        steps = next(iter(per_width.values()))["step"]
        out += [
            f"### {NAMES[key[0]]} · {NAMES[key[1]]}",
            "",
            "| width | lr | quantity | " + " | ".join(f"step {s}" for s in steps) + " |",
            "|---:|---:|---|" + "---:|" * len(steps),
        ]
        for width, row in sorted(per_width.items()):
            for quantity, label in QUANTITIES.items():
                if quantity in row:
                    out.append(
                        f"| {width} | {row['lr']:.3g} | {label} | "
                        + " | ".join(f"{v:.4g}" for v in row[quantity])
                        + " |"
                    )
        out.append("")
    return "\n".join(out)


def _cell(per_lr: Dict[float, Optional[float]], lr: float, best: Optional[float]) -> str:
    if per_lr.get(lr) is None:
        return "×" if lr in per_lr else ""  # diverged, or not run yet
    return f"**{per_lr[lr]:.4f}**" if lr == best else f"{per_lr[lr]:.4f}"


def report_text(spec: TransferSpec, results: Dict[str, dict]) -> str:
    """results.md: the loss tables, then the schedule's table where the runs recorded one."""
    losses = mean_losses(spec, results)
    along = schedules(spec, results, losses)
    return markdown(spec, losses) + ("\n" + schedule_markdown(along) if along else "")


def write_report(spec: TransferSpec, directory: Path) -> tuple:
    """results.md and transfer.png (and schedule.png) in the experiment directory, from whatever has finished."""
    results = read_results(directory)
    losses = mean_losses(spec, results)
    if not losses:
        raise ValueError(f"{directory} has no finished runs to report yet")
    table, figure = directory / "results.md", directory / "transfer.png"
    table.write_text(report_text(spec, results))
    plot_transfer(losses, figure)
    along = schedules(spec, results, losses)
    if along:
        plot_schedules(along, QUANTITIES, directory / "schedule.png")
    return table, figure
