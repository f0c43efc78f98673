"""Stage 3 of the protocol: results.md and its figures, from the cells' run directories — the LR
sweep, every size's table and paired Δ against the reference, the scale check."""
from pathlib import Path
from typing import Dict, List, Optional

from analysis import reference as ref
from analysis import scale
from analysis.ablation.cells import DIVERGED, FINISHED, CellState
from analysis.ablation.protocol import Cell, Spec, at_grid_edge, stage1_cells, stage2_cells
from analysis.delta_plots import plot_delta_vs_size, plot_forest
from analysis.params import model_params
from analysis.plots import has_activation_rms, plot_activation_rms, plot_lr_sweep, plot_val_curves
from analysis.runs import Variant
from analysis.stats import compare
from analysis.table import final_bpb, markdown as results_table, summarize_variants

States = Dict[Cell, CellState]


def write(spec: Spec, states: States, chosen: Dict[str, Dict[str, Optional[float]]], out: Path, title: str) -> str:
    """Write results.md and the figures into `out`; return the markdown. Works on a partial protocol
    too (it reports what has finished and says what has not)."""
    out.mkdir(parents=True, exist_ok=True)
    sections = [f"# {title}\n", _setup(spec, states), _lr_section(spec, states, chosen, out)]
    results, forest = [], {}
    for size in spec.sizes:
        variants = _stage2_variants(spec, states, chosen, size)
        if not variants:
            sections.append(f"## {size}: no finished stage-2 runs yet\n")
            continue
        rows = summarize_variants(variants)
        reference = next((v for v in variants if v.label == spec.reference), None)
        pairs = [] if reference is None else [ref.Versus(v, reference, compare(final_bpb(v), final_bpb(reference)))
                                              for v in variants if v is not reference]
        forest[size] = pairs
        results.append(scale.SizeResult(size, [r.variant.label for r in rows], {p.variant.label: p.comparison
                                                                               for p in pairs}))
        sections += [f"## {size}: every variant at its own LR, {len(spec.seeds)} seeds\n", results_table(rows),
                     ref.markdown(pairs) if pairs else f"No finished runs of the reference {spec.reference} here.\n"]
        dropped = [v for v, lr in chosen.get(size, {}).items() if lr is None]
        if dropped:
            sections.append(f"Not in stage 2 (diverged at every LR of the grid): {', '.join(dropped)}.\n")
        sections.append(_curves(variants, size, out))
    if any(p.comparison.test for pairs in forest.values() for p in pairs):
        plot_forest({s: p for s, p in forest.items() if p}, out / "forest.png")
        sections.append("![paired Δ per variant, 95 % CI](forest.png)\n")
    if len(results) > 1:
        sections.append(_scale_section(spec, states, results, out))
    text = "\n".join(sections)
    (out / "results.md").write_text(text)
    return text


def _setup(spec: Spec, states: States) -> str:
    counts = {}
    for s in states.values():
        counts[s.state] = counts.get(s.state, 0) + 1
    variants = "; ".join(f"**{name}**: {' '.join(o) or 'the preset'}" for name, o in spec.variants.items())
    sizes = "; ".join(f"**{name}**: {' '.join(o) or 'the preset'}" for name, o in spec.sizes.items())
    reuse = f" (the stage-1 run is seed {spec.stage1_seed}'s)" if spec.stage1_seed in spec.seeds else ""
    return "\n".join([
        (f"Preset `experiment={spec.experiment}`" if spec.experiment else "train.py's defaults")
        + (f" with `{' '.join(spec.train_overrides)}`" if spec.train_overrides else "") + ".",
        f"Variants ({spec.reference} is the reference): {variants}.", f"Sizes: {sizes}.",
        f"Stage 1: LR grid {', '.join(f'{lr:g}' for lr in spec.lr_grid)} (min_lr = {spec.min_lr_ratio:g} × lr), "
        f"seed {spec.stage1_seed}. Stage 2: each variant at its best stage-1 LR, seeds "
        f"{', '.join(map(str, spec.seeds))}" + reuse + ".",
        "Cells: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + ".", ""])


def _lr_section(spec: Spec, states: States, chosen, out: Path) -> str:
    sweeps = {size: {} for size in spec.sizes}
    for cell in stage1_cells(spec):
        state = states.get(cell)
        if state is not None and state.state in (FINISHED, DIVERGED):
            sweeps[cell.size].setdefault(cell.variant, {})[cell.lr] = state.final_bpb
    lines = ["## Stage 1: learning-rate sweep\n"]
    for size, per_variant in sweeps.items():
        header = ["variant"] + [f"lr {lr:g}" for lr in spec.lr_grid] + ["chosen"]
        lines += [f"**{size}** (final val bpb, seed {spec.stage1_seed}):", "",
                  "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for variant in spec.variants:
            results, best = per_variant.get(variant, {}), chosen.get(size, {}).get(variant)
            cells = [_bpb_cell(results, lr, best) for lr in spec.lr_grid]
            note = "—" if best is None and len(results) < len(spec.lr_grid) else (
                "diverged at every LR" if best is None else f"{best:g}" + (
                    " ⚠ grid edge" if at_grid_edge(best, spec.lr_grid) else ""))
            lines.append("| " + " | ".join([variant] + cells + [note]) + " |")
        lines.append("")
    if any(at_grid_edge(lr, spec.lr_grid) for per in chosen.values() for lr in per.values() if lr is not None):
        lines.append("⚠ grid edge: the best LR is the smallest or largest tried, so the optimum may lie outside "
                     "the grid; widen `--lrs` and rerun (finished cells are kept).\n")
    if any(sweeps.values()):
        plot_lr_sweep({s: v for s, v in sweeps.items() if v}, chosen, out / "lr_sweep.png")
        lines.append("![LR sweep](lr_sweep.png)\n")
    return "\n".join(lines)


def _bpb_cell(results: Dict[float, Optional[float]], lr: float, best: Optional[float]) -> str:
    if lr not in results:
        return "—"
    if results[lr] is None:
        return "diverged"
    return f"**{results[lr]:.4f}**" if lr == best else f"{results[lr]:.4f}"


def _stage2_variants(spec: Spec, states: States, chosen, size: str) -> List[Variant]:
    variants = {}
    for cell in stage2_cells(spec, chosen):
        state = states.get(cell)
        if cell.size == size and state is not None and state.state == FINISHED:
            variants.setdefault(cell.variant, Variant(cell.variant)).runs.append(state.run)
    return [variants[v] for v in spec.variants if v in variants]


def _curves(variants: List[Variant], size: str, out: Path) -> str:
    plot_val_curves(variants, out / f"val_curves_{size}.png")
    lines = [f"![validation curves at {size}](val_curves_{size}.png)"]
    if has_activation_rms(variants):
        plot_activation_rms(variants, out / f"activation_rms_{size}.png")
        lines.append(f"![per-layer residual RMS at {size}](activation_rms_{size}.png)")
    return "\n".join(lines) + "\n"


def _scale_section(spec: Spec, states: States, results: List[scale.SizeResult], out: Path) -> str:
    sizes, deltas = [], {}
    for r in results:
        finished = [s for c, s in states.items() if c.size == r.name and s.state == FINISHED]
        # x = the reference's parameters; any variant's if the reference never finished at this size
        run = next((s.run for s in finished if s.cell.variant == spec.reference), finished[0].run)
        sizes.append((r.name, model_params(run.config["model"])["total"]))
    for variant in spec.variants:
        if variant != spec.reference:
            deltas[variant] = [r.comparisons[variant].test if variant in r.comparisons else None for r in results]
    plot_delta_vs_size(sizes, deltas, out / "delta_vs_size.png", spec.reference)
    return "\n".join(["## Does it hold at scale?\n", scale.markdown(results, spec.reference),
                      "![Δ vs model size](delta_vs_size.png)\n"])
