"""The results table: one row per variant (mean ± std over seeds, parameters, learning rate), the
best marked, and whether the best really beats the runner-up."""

import math
from dataclasses import dataclass
from typing import Dict, List, Sequence

import torch

from analysis.runs import Run, RunsError, Variant, steady_tokens_per_s, varying_keys
from analysis.stats import Comparison, Summary, compare, p_text, summarize
from model import ModelConfig, Transformer

VS_BEST = {"better": "better", "worse": "behind", "unclear": "can't tell", "same": "identical", "none": "no test"}
# The data.* keys that choose the validation text (the tokenizer and the training order do not: bpb is per byte).
VAL_TEXT = "source path data_files name text_column sample_by val_split val_fraction val_token_budget seed".split()


@dataclass
class Row:
    variant: Variant
    params: dict  # Transformer.param_counts() + intermediate_size
    val_loss: Summary
    val_bpb: Summary
    tokens_per_s: float  # mean over seeds of each run's steady_tokens_per_s
    wall_time_s: float  # mean over seeds
    tokens: int  # training tokens at the final eval
    lr: str  # optim.lr of the variant's runs ("a–b" if its seeds differ)


def model_params(model_config: dict) -> Dict[str, int]:
    """Transformer.param_counts() and the resolved intermediate_size of a run's model, built on the meta device
    (shapes only, no memory): the model's own accounting, not a formula."""
    cfg = ModelConfig(**model_config)
    with torch.device("meta"):
        counts = Transformer(cfg).param_counts()
    # unset in the config means derived: 8/3·d rounded up for gated MLPs, 4·d for the others
    return {**counts, "intermediate_size": cfg.resolved_intermediate_size}


def final_bpb(variant: Variant) -> Dict[int, float]:
    """{seed: val bpb at the final eval}: what paired comparisons match up."""
    return {run.seed: run.final["val_bpb"] for run in variant.runs}


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
        lrs = sorted({r.config.get("optim", {}).get("lr") for r in v.runs} - {None})
        rows.append(
            Row(
                v,
                params,
                summarize([f["val_loss"] for f in finals]),
                summarize([f["val_bpb"] for f in finals]),
                _mean(steady_tokens_per_s(r.trains) or math.nan for r in v.runs),
                _mean(r.wall_time_s() for r in v.runs),
                max(f["tokens"] for f in finals),
                "–".join(f"{lr:g}" for lr in lrs),
            )
        )
    return sorted(rows, key=lambda row: row.val_bpb.mean)


def verdict(rows: Sequence[Row]) -> str:
    """One sentence on whether the best variant really beats the runner-up."""
    if len(rows) < 2:
        return "Only one variant: nothing to compare."
    best, second = rows[0].variant.label, rows[1].variant.label
    comparison = compare(final_bpb(rows[1].variant), final_bpb(rows[0].variant))  # paired over their common seeds
    outcome, sentence = comparison.outcome, comparison.verdict()
    if outcome == "worse":  # the runner-up is worse than the best. Not in bold: the two were picked from the table
        # after the fact and the test is unadjusted, so it is a description, never a pre-registered verdict.
        return (
            f"{best} is ahead of the runner-up {second} (a post-hoc, unadjusted comparison of the table's two "
            f"best, not a verdict): {second} is {sentence}."
        )
    if outcome == "none":
        return (
            f"**Not conclusive:** {best} leads {second} by {rows[1].val_bpb.mean - rows[0].val_bpb.mean:.4f} "
            f"bpb, but with {sentence[len('no verdict: ') :]}; run more seeds (e.g. seed=0,1,2)."
        )
    return (
        f"**Within seed noise:** {best} leads {second} on the mean, but {second} vs {best}: {sentence}; "
        "more seeds or a longer run are needed to separate them."
    )


def markdown(rows: Sequence[Row], skipped: Sequence[Run] = ()) -> str:
    """The table, the best-vs-runner-up verdict, and the shared setup."""
    header = [
        "variant",
        "params",
        "MLP params",
        "intermediate",
        "lr",
        "val loss",
        "val bpb",
        "tokens/s",
        "wall time",
        "seeds",
        "Δ bpb vs ★ (paired)",
    ]
    cells = []
    for i, row in enumerate(rows):
        p, bpb = row.params, _pm(row.val_bpb)
        cells.append(
            [
                ("★ " if i == 0 else "") + row.variant.label,
                f"{p['total']:,}",
                f"{p['mlp']:,}",
                str(p["intermediate_size"]),
                row.lr,
                _pm(row.val_loss),
                f"**{bpb}**" if i == 0 else bpb,
                f"{row.tokens_per_s:,.0f}",
                _duration(row.wall_time_s),
                str(row.val_bpb.n),
                "—" if i == 0 else vs_best(compare(final_bpb(row.variant), final_bpb(rows[0].variant))),
            ]
        )
    lines = table_lines(header, cells)
    notes = [
        "",
        verdict(rows),
        "",
        _shared(rows),
        "Values are mean ± sample std (ddof=1) over seeds at the final eval; ★ = lowest mean val bpb. "
        "Params count the tied embedding once; MLP params are all layers' MLPs; tokens/s is the median "
        "over each run's log intervals (evals and the warm-up first excluded), averaged over seeds. Δ vs ★: every row by the same "
        "rule, the paired t-test over the seeds both ran (Welch without common seeds); 'can't tell' = its "
        "95 % CI includes 0, which is not 'the same'; unadjusted for the several rows and for the best being "
        "picked after the fact.",
    ]
    if len({row.tokens for row in rows}) > 1:
        notes.append(
            "⚠ The variants trained on different token budgets ("
            + ", ".join(f"{r.variant.label}: {r.tokens:,}" for r in rows)
            + "): not like for like."
        )
    runs = [r for row in rows for r in row.variant.runs]
    if text := [k for k in varying_keys(runs) if k.startswith("data.") and k[5:] in VAL_TEXT]:
        notes.append(
            f"⚠ The variants were scored on different validation text ({', '.join(text)} differ): their bpb "
            "compare the data as much as the models."
        )
    if skipped:
        notes.append(
            "Skipped (incomplete: diverged, stopped or still running): "
            + ", ".join(f"`{r.path.name}`" for r in skipped)
            + "."
        )
    return "\n".join(lines + notes) + "\n"


def table_lines(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """A markdown table: the header, its rule, a line per row."""
    line = lambda cells: "| " + " | ".join(cells) + " |"
    return [line(header), "|" + "---|" * len(header), *map(line, rows)]


def vs_best(c: Comparison) -> str:
    """A row against the best row, by the one rule every row gets: '+0.0094 (can't tell, p = 0.60)'."""
    t = c.test
    if t is None:
        return f"{c.paired.delta:+.4f} (no test: 1 seed)" if c.paired else "n/a"
    p = "no spread" if t.zero_spread else p_text(t.p)
    return f"{t.delta:+.4f} ({VS_BEST[c.outcome]}, {p})"


def _shared(rows: Sequence[Row]) -> str:
    c = rows[0].variant.config
    m, t, o, d = c["model"], c["trainer"], c["optim"], c["data"]
    runs = [r for row in rows for r in row.variant.runs]
    min_lrs = {r.config["optim"].get("min_lr") for r in runs}
    decay = f"min_lr {min_lrs.pop():g}" if len(min_lrs) == 1 else "each run's min_lr"
    ends = sorted({r.max_steps for r in runs})  # a time budget plans each run's own
    steps = f"{ends[0]}" if len(ends) == 1 else f"{ends[0]}–{ends[-1]}"
    return (
        f"Setup (every variant's, unless its label says otherwise): {d.get('source')} data (vocab "
        f"{d.get('vocab_size')}), {steps} steps, {rows[0].tokens:,} tokens; {o.get('warmup_steps')} "
        f"warmup steps, then {o.get('schedule', 'cosine')} decay to {decay}; hidden_size {m.get('hidden_size')}, "
        f"{m.get('n_layers')} layers; precision {t.get('precision')}."
    )


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "n/a"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _pm(s: Summary) -> str:
    return f"{s.mean:.4f} ± " + ("n/a" if math.isnan(s.std) else f"{s.std:.4f}")


def _mean(values) -> float:
    values = [v for v in values if not math.isnan(v)]
    return sum(values) / len(values) if values else float("nan")
