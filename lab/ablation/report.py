"""Stage 3 of the protocol, from the cells' run directories: results.md (the verdicts and the literature, the power, the
LR sweeps, the tables, the depth check), its figures and its data files (per_seed.csv, contrasts.csv, results.json)."""

import csv
import json
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import matplotlib

from analysis.plots import figure, has_activation_rms, plot_activation_rms, plot_forest, plot_val_curves, save
from analysis.runs import Variant
from analysis.stats import CI, TTest
from analysis.table import markdown as results_table
from analysis.table import summarize_variants, table_lines
from lab import stats as power
from lab.ablation import contrasts as K
from lab.ablation.contrasts import LR_CHOICES, LR_WORDS, Contrast
from lab.ablation.lr_search import edge_note, margin
from lab.ablation.protocol import Cell, CellState, Spec, done_bpb, lr_sweep
from lab.stats import BETTER, CANT_TELL, EQUIVALENT, WORSE, method_name
from lab.sweep import FINISHED

States = Dict[Cell, CellState]


def write(
    spec: Spec,
    states: States,
    chosen: Dict[str, Dict[str, Optional[float]]],
    out: Path,
    title: str,
    registered: str,
    planning_source: str = "the spec's planning_sd",
    level: tuple = (None, 1),
) -> str:
    """Write results.md, its figures and data files into `out` (a partial protocol too); return the markdown.
    level: (α, looks) of a sequential design (lab/stats.py), (None, 1) for the spec's α."""
    out.mkdir(parents=True, exist_ok=True)
    contrasts = K.judge_protocol(spec, states, chosen, level[0])
    sequential = (
        f"Sequential design: seeds were added after a look, so every family is judged at α / {level[1]} "
        f"looks = {level[0]:.3g}.\n"
        if level[1] > 1
        else ""
    )
    sections = [
        f"# {title}\n",
        _setup(spec, states) + sequential + registered + "\n",
        _verdicts(spec, contrasts),
        _power(spec, contrasts, planning_source),
        _lr_section(spec, states, chosen, out),
    ]
    rankings, forest, params = {}, {}, {}
    for size in spec.sizes:
        variants = _own_lr_variants(spec, states, chosen, size)
        if not variants:
            sections.append(f"## {size}: no finished stage-2 runs yet\n")
            continue
        rows = summarize_variants(variants)
        rankings[size] = [r.variant.label for r in rows]
        # x of the depth plot: the reference's parameters (any variant's if the reference never finished)
        params[size] = next((r.params for r in rows if r.variant.label == spec.reference), rows[0].params)["total"]
        forest[size] = [
            (c.variant, c.verdict.test, c.verdict.outcome) for c in K.pick(contrasts, choice="own", size=size)
        ]
        sections += [f"## {size}: every variant at its own best LR, seeds {_seeds(spec.seeds)}\n", results_table(rows)]
        dropped = [v for v, lr in chosen.get(size, {}).items() if lr is None]
        if dropped:
            sections.append(f"Not in stage 2 at their own LR (diverged at every LR tried): {', '.join(dropped)}.\n")
        sections.append(_curves(variants, size, out))
    sections.append("## Every contrast\n")
    sections += [K.markdown(spec, contrasts, choice) for choice in K.LR_CHOICES]
    if any(t for rows in forest.values() for _, t, _ in rows):
        plot_forest({s: rows for s, rows in forest.items() if rows}, out / "forest.png", spec.reference)
        sections.append("![paired Δ per variant at its own LR, 95 % CI, coloured by verdict](forest.png)\n")
    if len(params) > 1:
        own = {s: {c.variant: c.verdict for c in K.pick(contrasts, choice="own", size=s)} for s in spec.sizes}
        sections += ["## Does it hold across sizes?\n", K.scale_markdown(own, rankings, spec.reference)]
        deltas = {
            v: [
                next((c.verdict.test for c in K.pick(contrasts, choice="own", size=s, variant=v)), None) for s in params
            ]
            for v in spec.variants
            if v != spec.reference
        }
        plot_delta_vs_size(list(params.items()), deltas, out / "delta_vs_size.png", spec.reference)
        sections.append("![Δ vs model size](delta_vs_size.png)\n")
    files = write_files(out, spec, states, chosen, contrasts, registered)
    sections.append(
        "Every number above, per seed: "
        + ", ".join(f"[{f}]({f})" for f in files)
        + " (per_seed.csv: every cell; contrasts.csv: every contrast's per-seed differences and tests).\n"
    )
    text = "\n".join(sections)
    (out / "results.md").write_text(text)
    return text


def _seeds(seeds) -> str:
    return ", ".join(map(str, seeds))


def _setup(spec: Spec, states: States) -> str:
    counts = Counter(s.state for s in states.values())
    variants = "; ".join(f"**{name}**: {' '.join(o) or 'the preset'}" for name, o in spec.variants.items())
    sizes = "; ".join(f"**{name}**: {' '.join(o) or 'the preset'}" for name, o in spec.sizes.items()) + "".join(
        f"; {v} only at {', '.join(at)}" for v, at in spec.variant_sizes.items()
    )
    grid = ", ".join(f"{lr:g}" for lr in spec.lr_grid)
    return "\n".join(
        [
            (f"Preset `experiment={spec.experiment}`" if spec.experiment else "train.py's defaults")
            + (f" with `{' '.join(spec.train_overrides)}`" if spec.train_overrides else "")
            + ".",
            f"Variants ({spec.reference} is the reference): {variants}.",
            f"Sizes: {sizes}.",
            f"Stage 1 (LR choice) on seed {spec.stage1_seed}, never a measuring seed: LR grid {grid} (min_lr = "
            f"{spec.min_lr_ratio:g} × lr); a best LR at the grid's edge adds one point beyond it, up to "
            f"{spec.lr_extensions} times"
            + (
                f"; LRs within {spec.lr_tie_tolerance:g} bpb of the best are a tie, won by the smallest"
                if spec.lr_tie_tolerance
                else ""
            )
            + f". Stage 2 (measurement) on seeds {_seeds(spec.seeds)}: every variant at its "
            f"own best LR and at {spec.reference}'s (the shared LR).",
            f"Pre-registered before training: primary contrasts {', '.join(spec.primary) or '(none)'}; secondary "
            f"{', '.join(spec.secondary) or '(none)'} (each vs {spec.reference}). Each family (one tier's contrasts × "
            f"sizes, at one LR choice) is adjusted on its own by {method_name(spec.multitest)} (statsmodels' "
            f"multipletests) at α = {spec.alpha:g}. "
            f"Verdicts: **better/worse** when the adjusted paired t-test rejects Δ = 0; else **equivalent** when the "
            f"adjusted paired TOST shows |Δ| < {spec.equivalence_margin:g} bpb; else **can't tell** (absence of "
            "evidence is not equivalence). Beside each verdict: its p under one Holm correction over all the study's "
            "distinct tests; a family's better/worse that does not survive it reads \"can't tell study-wide\".",
            "Cells: " + ", ".join(f"{n} {state}" for state, n in sorted(counts.items())) + ".",
            _precisions(states),
            "",
        ]
    )


def _precisions(states: States) -> str:
    """What the cells trained in, from their metrics: a protocol resumed on another machine class under
    trainer.precision=auto may mix bf16 and fp32 cells, and a contrast across them measures the precision too."""
    counts = Counter("+".join(s.run.precisions) or "not recorded" for s in states.values() if s.run is not None)
    if not counts:
        return ""
    listed = ", ".join(f"{key} in {n}" for key, n in counts.most_common())
    mixed = len([k for k in counts if k != "not recorded"]) > 1 or any("+" in k for k in counts)
    return f"Precision (from the cells' metrics): {listed}." + (
        " ⚠ The cells did not all train in one precision (a resume on another machine class under "
        "`trainer.precision=auto`): a contrast across them measures the precision too; rerun the odd ones "
        "on one machine class, or pin `trainer.precision` in the protocol's overrides."
        if mixed
        else ""
    )


def _verdicts(spec: Spec, contrasts: List[K.Contrast]) -> str:
    lines = ["## Verdicts on the primary contrasts\n"]
    for choice in K.LR_CHOICES:
        rows = K.pick(contrasts, choice=choice, tier="primary")
        if rows:
            lines += [f"{K.LR_WORDS[choice][0].upper() + K.LR_WORDS[choice][1:]}:", ""]
            lines += [f"- **{c.variant} vs {spec.reference}** at {c.size}: {c.sentence()}" for c in rows]
            lines.append("")
    text = literature_paragraph(spec.variants, spec.primary, contrasts)
    return "\n".join(lines) + ("\n### Against the literature\n\n" + text if text else "")


def _power(spec: Spec, contrasts: List[K.Contrast], source: str) -> str:
    """The MDE the plan promised (planning sd) and the one the measured spread gives, per family."""
    lines = [
        "## Power\n",
        f"Minimum detectable effect (MDE) of a two-sided paired t-test at {spec.power:.0%} power, "
        f"{len(spec.seeds)} seeds, at each family's strictest {method_name(spec.multitest)} level α/m:",
        "",
    ]
    for tier in spec.tiers:
        diffs = {
            f"{c.size}/{c.variant}": [c.variant_bpb[s] - c.reference_bpb[s] for s in c.seeds]
            for c in K.pick(contrasts, tier=tier, choice="own")
        }
        observed = power.pooled_sd(diffs)
        planned = (
            f"planned {spec.mde(tier, spec.planning_sd):.4f} bpb (sd {spec.planning_sd:.4f}, {source})"
            if spec.planning_sd
            else "no planning spread"
        )
        measured = (
            f"at the measured spread {spec.mde(tier, observed):.4f} bpb (pooled sd "
            f"{observed:.4f} over {power.pooled_dof(diffs)} dof)"
            if observed
            else "no measured spread yet"
        )
        m, a = len(spec.family_tests(tier)), spec.family_alpha(tier)
        lines.append(f"- {tier} (m = {m}, α/m = {a:.4f}): {planned}; {measured}")
    lines += [
        "",
        f"A 'can't tell' on an effect smaller than the MDE says the study was too small to see it; "
        f"the target for the primaries was {spec.target_mde:g} bpb.",
        "",
    ]
    return "\n".join(lines)


def _margin_note(results: dict, best: float) -> str:
    """'; margin …' — how far the chosen LR's bpb is below the runner-up's (one seed: a small margin is a near-tie)."""
    m = margin(results, best)
    return "" if m is None else f"; margin {m:+.3f} bpb over the runner-up"


def _lr_section(spec: Spec, states: States, chosen, out: Path) -> str:
    done = done_bpb({c: s for c, s in states.items() if c.seed == spec.stage1_seed})
    sweeps, lines = {size: {} for size in spec.sizes}, ["## Stage 1: learning-rate sweep\n"]
    for size in spec.sweep_sizes:
        lrs = sorted({c.lr for c in done if c.size == size} | set(spec.lr_grid))
        rows = []
        for variant in spec.variants_at(size):
            sweep = lr_sweep(spec, size, variant, done)
            results = {c.lr: bpb for c, bpb in done.items() if (c.size, c.variant) == (size, variant)}
            if results:
                sweeps[size][variant] = results
            best = chosen.get(size, {}).get(variant)
            note = (
                (
                    f"{best:g} ({edge_note(sweep, spec.lr_extensions)}{_margin_note(results, best)})"
                    if best is not None
                    else edge_note(sweep, spec.lr_extensions)
                )
                if sweep.settled
                else "still sweeping"
            )
            rows.append([variant] + [_bpb_cell(results, lr, best, lr not in spec.lr_grid) for lr in lrs] + [note])
        lines += [
            f"**{size}** (final val bpb, seed {spec.stage1_seed}; † = an extension beyond the grid):",
            "",
            *table_lines(["variant"] + [f"lr {lr:g}" for lr in lrs] + ["chosen"], rows),
            "",
        ]
    others = [size for size in spec.sizes if size not in spec.sweep_sizes]
    if others:
        lines += [
            f"Sizes {', '.join(others)} reuse the LRs chosen at **{spec.transfer_from}** (`transfer_from`): every "
            "cell trains under μP (`model.parametrization=mup`, base width = that size's), whose best LR holds "
            "across width (docs/mup.md shows how far that held in our transfer experiment).",
            "",
        ]
    if any(sweeps.values()):
        plot_lr_sweep({s: v for s, v in sweeps.items() if v}, chosen, out / "lr_sweep.png")
        lines.append("![LR sweep](lr_sweep.png)\n")
    return "\n".join(lines)


def _bpb_cell(results: Dict[float, Optional[float]], lr: float, best: Optional[float], extension: bool) -> str:
    if lr not in results:
        return "—"
    mark = "†" if extension else ""
    if results[lr] is None:
        return "diverged" + mark
    return (f"**{results[lr]:.4f}**" if lr == best else f"{results[lr]:.4f}") + mark


def _own_lr_variants(spec: Spec, states: States, chosen, size: str) -> List[Variant]:
    variants = {}
    for variant in spec.variants:
        lr = chosen.get(size, {}).get(variant)
        for seed in spec.seeds:
            state = states.get(Cell(size, variant, lr, seed)) if lr is not None else None
            if state is not None and state.state == FINISHED:
                variants.setdefault(variant, Variant(variant)).runs.append(state.run)
    return [variants[v] for v in spec.variants if v in variants]


def _curves(variants: List[Variant], size: str, out: Path) -> str:
    plot_val_curves(variants, out / f"val_curves_{size}.png")
    lines = [f"![validation curves at {size}](val_curves_{size}.png)"]
    if has_activation_rms(variants):
        plot_activation_rms(variants, out / f"activation_rms_{size}.png")
        lines.append(f"![per-layer residual RMS at {size}](activation_rms_{size}.png)")
    return "\n".join(lines) + "\n"


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


def plot_lr_sweep(
    sweeps: Dict[str, Dict[str, Dict[float, Optional[float]]]], chosen: Dict[str, Dict[str, float]], path: Path
) -> None:
    """One panel per size: final val bpb against LR (log) per variant; a diverged LR (None) is an ×
    on the panel's top edge, the chosen LR a ring."""
    fig, axes = figure(1, len(sweeps), figsize=(6 * len(sweeps), 4.5), squeeze=False)
    labels = sorted({v for per_size in sweeps.values() for v in per_size})
    cmap = matplotlib.colormaps["tab10"]
    palette = {label: cmap(i % 10) for i, label in enumerate(labels)}
    for ax, (size, per_variant) in zip(axes[0], sweeps.items()):
        finite = [b for results in per_variant.values() for b in results.values() if b is not None]
        top = max(finite) + 0.05 * (max(finite) - min(finite) + 1e-3) if finite else 1.0
        for variant, results in per_variant.items():
            lrs = sorted(results)
            ok = [(lr, results[lr]) for lr in lrs if results[lr] is not None]
            if ok:
                ax.plot(*zip(*ok), marker="o", color=palette[variant], label=variant)
            bad = [lr for lr in lrs if results[lr] is None]
            ax.scatter(bad, [top] * len(bad), marker="x", s=60, color=palette[variant], clip_on=False)
            best = chosen.get(size, {}).get(variant)
            if best is not None and results.get(best) is not None:
                ax.scatter([best], [results[best]], s=160, facecolors="none", edgecolors=palette[variant], lw=2)
        ax.set_xscale("log")
        ax.set_xlabel("peak learning rate (optim.lr)")
        ax.set_ylabel("final val bpb (stage 1, one seed)")
        ax.set_title(f"{size}: LR sweep (ring = chosen, × = diverged)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save(fig, path)


# --- the data files: every number of the report, per seed ---

CELL_FIELDS = ["stage", "size", "variant", "lr", "seed", "state", "val_loss", "val_bpb", "tokens", "precision"]
CONTRAST_FIELDS = "lr_choice family size variant reference lr reference_lr seeds delta ci_low ci_high p p_adjusted tost_p_lower tost_p_upper tost_p_adjusted verdict p_study_wide per_seed_delta".split()


def cell_rows(spec: Spec, states: Dict[Cell, CellState]) -> List[dict]:
    rows = []
    for cell, s in sorted(states.items(), key=lambda kv: (kv[0].size, kv[0].variant, kv[0].lr, kv[0].seed)):
        final = s.run.final if s.run is not None and s.run.evals else {}
        rows.append(
            {
                "stage": "stage1" if cell.seed == spec.stage1_seed else "stage2",
                "size": cell.size,
                "variant": cell.variant,
                "lr": cell.lr,
                "seed": cell.seed,
                "state": s.state,
                "val_loss": _num(final.get("val_loss")) if s.final_bpb is not None else None,
                "val_bpb": _num(s.final_bpb),
                "tokens": final.get("tokens"),
                # "bf16", or "bf16+fp32" when a resume changed it; empty when not recorded
                "precision": "+".join(s.run.precisions) if s.run is not None else None,
            }
        )
    return rows


def contrast_rows(spec: Spec, contrasts: List[Contrast]) -> List[dict]:
    rows = []
    for c in contrasts:
        t, tost, v = c.verdict.test, c.verdict.tost, c.verdict
        rows.append(
            {
                "lr_choice": c.choice,
                "family": c.tier,
                "size": c.size,
                "variant": c.variant,
                "reference": spec.reference,
                "lr": c.lr,
                "reference_lr": c.reference_lr,
                "seeds": len(c.seeds),
                "delta": _num(t.delta) if t else None,
                "ci_low": _num(t.low) if t else None,
                "ci_high": _num(t.high) if t else None,
                "p": _num(t.p) if t else None,
                "p_adjusted": _num(v.p_adjusted),
                "tost_p_lower": _num(tost.p_lower) if tost else None,
                "tost_p_upper": _num(tost.p_upper) if tost else None,
                "tost_p_adjusted": _num(v.tost_adjusted),
                "verdict": v.outcome,
                "p_study_wide": _num(c.study_p) if c.study_p is not None else None,
                "per_seed_delta": {s: round(c.variant_bpb[s] - c.reference_bpb[s], 6) for s in c.seeds},
            }
        )
    return rows


FILES = ("per_seed.csv", "contrasts.csv", "results.json")


def write_files(
    out: Path, spec: Spec, states: Dict[Cell, CellState], chosen: dict, contrasts: List[Contrast], registered: str
) -> List[str]:
    """Write the three files into `out`; return their names. results.json carries the pre-registration's line."""
    cells, judged = cell_rows(spec, states), contrast_rows(spec, contrasts)
    _csv(out / "per_seed.csv", CELL_FIELDS, cells)
    _csv(
        out / "contrasts.csv",
        CONTRAST_FIELDS,
        [{**r, "per_seed_delta": ";".join(f"{s}:{d:+.6f}" for s, d in r["per_seed_delta"].items())} for r in judged],
    )
    (out / "results.json").write_text(
        json.dumps(
            {
                "preregistration": registered,
                "spec": spec.to_dict(),
                "chosen_lr": chosen,
                "cells": cells,
                "contrasts": judged,
            },
            indent=1,
            allow_nan=False,
        )
        + "\n"
    )
    return list(FILES)


def _csv(path: Path, fields: List[str], rows: List[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in row.items()} for row in rows)


def _num(value) -> Optional[float]:
    """JSON has no NaN: a missing or non-finite number is null."""
    return None if value is None or not math.isfinite(float(value)) else float(f"{float(value):.10g}")


# --- against the literature ---


@dataclass(frozen=True)
class Claim:
    override: str  # what the variant changes against the reference
    title: str
    says: str
    agree: Sequence[str]  # the variant's outcomes (variant − reference) that agree with the claim
    disagree: Sequence[str]
    why_not_here: str


CLAIMS = (
    Claim(
        "model.mlp=gelu",
        "SwiGLU vs GELU at matched parameters",
        "SwiGLU beat a GELU MLP of the same parameter count in language-model pre-training (Shazeer 2020, "
        "*GLU Variants Improve Transformer*) and was among the few modifications that held up across "
        "implementations (Narang et al. 2021, *Do Transformer Modifications Transfer Across Implementations "
        "and Applications?*): GELU should be **worse**",
        agree=(WORSE,),
        disagree=(BETTER, EQUIVALENT),
        why_not_here="those gains were measured at ~10⁸ parameters and ~10⁹–10¹⁰ tokens; here the models are "
        "under 10⁶ parameters trained on one epoch's worth of ~2M Shakespeare tokens (random "
        "windows, drawn with replacement) on a CPU, where "
        "the gate's extra multiplicative path has had little data to pay off, and a gap of the "
        "papers' size (a few hundredths of a nat) is close to this study's detectable effect",
    ),
    Claim(
        "model.norm=layernorm",
        "RMSNorm vs LayerNorm",
        "RMSNorm matched LayerNorm's quality while running faster (Zhang & Sennrich 2019, *Root Mean Square "
        "Layer Normalization*): LayerNorm should be **equivalent** (or worse), never better",
        agree=(EQUIVALENT, WORSE),
        disagree=(BETTER,),
        why_not_here="the claim is one of no difference, which only an equivalence test can support: with few "
        "seeds 'can't tell' is the expected answer, not a disagreement; its speed half is a GPU "
        "kernel argument, and at these widths on CPU the norm is a small part of a step",
    ),
)


def _word(outcome: str, claim: Claim) -> str:
    if outcome in claim.agree:
        return "agrees"
    if outcome in claim.disagree:
        return "disagrees"
    return "can't tell"


def claim_for(variant_overrides: Sequence[str]) -> List[Claim]:
    return [c for c in CLAIMS if c.override in variant_overrides]


def literature_paragraph(variants: Dict[str, List[str]], primary: Sequence[str], contrasts: List[Contrast]) -> str:
    """One paragraph per literature claim a primary variant tests, from its verdicts at both LR choices."""
    out = []
    for variant in primary:
        for claim in claim_for(variants.get(variant, [])):
            parts, words = [], set()
            for choice in LR_CHOICES:
                found = K.pick(contrasts, variant=variant, choice=choice, tier="primary")
                if not found:
                    continue
                each = [f"{c.size}: {c.verdict.outcome} ({_word(c.verdict.outcome, claim)})" for c in found]
                words |= {_word(c.verdict.outcome, claim) for c in found}
                parts.append(f"{LR_WORDS[choice]}, {'; '.join(each)}")
            overall = _overall(words)
            out.append(
                f"**{claim.title}** (`{variant}`). The literature: {claim.says}. This study **{overall}** — "
                + " — ".join(parts)
                + "."
                + ("" if overall == "agrees" else f" Why it may not agree at this scale: {claim.why_not_here}.")
            )
    return "\n\n".join(out) + ("\n" if out else "")


def _overall(words: set) -> str:
    if words == {"agrees"}:
        return "agrees"
    if words == {"disagrees"}:
        return "disagrees"
    if "agrees" in words and "disagrees" in words:
        return "is mixed (agrees at some sizes or LR choices, disagrees at others)"
    if not words or words == {CANT_TELL}:
        return "can't tell"
    return "partly " + ("agrees" if "agrees" in words else "disagrees") + " (can't tell elsewhere)"
