"""The comparison table: one row per variant (mean ± std over seeds), the best marked, a noise verdict."""
import math
from dataclasses import dataclass
from typing import List, Sequence

from analysis.params import model_params
from analysis.runs import Run, RunsError, Variant
from analysis.stats import Summary, noise_of_difference, summarize, within_noise


@dataclass
class Row:
    variant: Variant
    params: dict  # Transformer.param_counts() + intermediate_size
    val_loss: Summary
    val_bpb: Summary
    tokens_per_s: float  # mean over seeds
    wall_time_s: float  # mean over seeds
    tokens: int  # training tokens at the final eval


def summarize_variants(variants: Sequence[Variant]) -> List[Row]:
    """Rows sorted best first. Ranked by bits per byte: it orders like val loss on one tokenizer
    and stays comparable when variants use different tokenizers."""
    rows = []
    for v in variants:
        try:
            params = model_params(v.config["model"])
        except (TypeError, ValueError) as e:
            raise RunsError(f"{v.runs[0].path}: cannot build the model from config.yaml: {str(e).splitlines()[0]}")
        finals = [r.final for r in v.runs]
        rows.append(Row(v, params, summarize([f["val_loss"] for f in finals]),
                        summarize([f["val_bpb"] for f in finals]),
                        _mean(r.tokens_per_s() for r in v.runs), _mean(r.wall_time_s() for r in v.runs),
                        max(f["tokens"] for f in finals)))
    return sorted(rows, key=lambda row: row.val_bpb.mean)


def verdict(rows: Sequence[Row]) -> str:
    """One sentence on whether the best variant really beats the runner-up."""
    if len(rows) < 2:
        return "Only one variant: nothing to compare."
    best, second = rows[0], rows[1]
    delta, se = second.val_bpb.mean - best.val_bpb.mean, noise_of_difference(best.val_bpb, second.val_bpb)
    verdict_ = within_noise(best.val_bpb, second.val_bpb)
    if verdict_ is None:
        return (f"Not conclusive: {best.variant.label} leads {second.variant.label} by {delta:.4f} bpb, but with "
                "a single seed there is no std and no noise estimate; run more seeds (e.g. seed=0,1,2).")
    if verdict_:
        return (f"**Within seed noise:** {best.variant.label} leads {second.variant.label} by {delta:.4f} bpb, "
                f"less than 2× the standard error of the difference ({se:.4f}); more seeds or a longer run "
                "are needed to separate them.")
    return (f"{best.variant.label} beats the runner-up {second.variant.label} by {delta:.4f} bpb, more than 2× "
            f"the standard error of the difference ({se:.4f}): outside seed noise.")


def markdown(rows: Sequence[Row], skipped: Sequence[Run] = ()) -> str:
    header = ["variant", "params", "MLP params", "intermediate", "val loss", "val bpb", "Δ bpb vs best",
              "tokens/s", "wall time", "seeds"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for i, row in enumerate(rows):
        p = row.params
        bpb = _pm(row.val_bpb)
        lines.append("| " + " | ".join([
            ("★ " if i == 0 else "") + row.variant.label, f"{p['total']:,}", f"{p['mlp']:,}",
            str(p["intermediate_size"]), _pm(row.val_loss), f"**{bpb}**" if i == 0 else bpb, _delta(rows[0], row),
            f"{row.tokens_per_s:,.0f}", _duration(row.wall_time_s), str(row.val_bpb.n)]) + " |")
    notes = ["", verdict(rows), "", _shared(rows),
             "Values are mean ± sample std (ddof=1) over seeds at the final eval; ★ = lowest mean val bpb. "
             "Params count the tied embedding once; MLP params are all layers' MLPs."]
    if len({row.tokens for row in rows}) > 1:
        notes.append("⚠ The variants trained on different token budgets ("
                     + ", ".join(f"{r.variant.label}: {r.tokens:,}" for r in rows) + "): not like for like.")
    if skipped:
        notes.append("Skipped (incomplete: diverged, stopped or still running): "
                     + ", ".join(f"`{r.path.name}`" for r in skipped) + ".")
    return "\n".join(lines + notes) + "\n"


def _shared(rows: Sequence[Row]) -> str:
    c = rows[0].variant.config
    m, t, o, d = c["model"], c["trainer"], c["optim"], c["data"]
    return (f"Setup (every variant's, unless its label says otherwise): {d.get('source')} data (vocab {d.get('vocab_size')}), {t['max_steps']} steps, "
            f"{rows[0].tokens:,} tokens; lr {o.get('lr')} → {o.get('min_lr')} after {o.get('warmup_steps')} "
            f"warmup steps; hidden_size {m.get('hidden_size')}, {m.get('n_layers')} layers; {t.get('precision')}.")


def _delta(best: Row, row: Row) -> str:
    if row is best:
        return "—"
    text = f"+{row.val_bpb.mean - best.val_bpb.mean:.4f}"
    return text + (" (within noise)" if within_noise(best.val_bpb, row.val_bpb) else "")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _pm(s: Summary) -> str:
    return f"{s.mean:.4f} ± " + ("n/a" if math.isnan(s.std) else f"{s.std:.4f}")


def _mean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")
