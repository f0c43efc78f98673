"""Every variant against a reference variant: which runs are the reference, and the paired Δ table (Welch's unpaired
test beside it, to show what pairing buys)."""

import difflib
import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

import yaml

from analysis.runs import RunsError, Variant, flatten, varying_keys
from analysis.stats import CI, Comparison, TTest, compare, format_p
from analysis.table import final_bpb, table_lines

# The default model is the reference: LLaMA's choices.
DEFAULT_REFERENCE = ("model.norm=rmsnorm", "model.mlp=swiglu", "model.qk_norm=false")

OUTCOME_WORDS = {
    "better": "**better**",
    "worse": "**worse**",
    "unclear": "can't tell yet",
    "same": "identical",
    "none": "no verdict",
}


@dataclass
class Versus:
    variant: Variant
    reference: Variant
    comparison: Comparison


def parse_reference(items: Sequence[str]) -> Dict[str, object]:
    """['model.norm=rmsnorm', ...] → {'model.norm': 'rmsnorm', ...}; values parsed as YAML (false → False)."""
    spec = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise RunsError(f"--reference {item!r} is not key=value (e.g. model.norm=rmsnorm)")
        spec[key.strip()] = yaml.safe_load(value) if value else ""
    return spec


def references_by_config(variants: Sequence[Variant], spec: Dict[str, object]) -> Dict[str, Optional[Variant]]:
    """{variant label: its reference or None}. A variant's reference matches `spec` and agrees with
    it on every other key that varies between the runs (e.g. the same hidden_size); a variant that
    matches `spec` itself is a reference and maps to itself."""
    varying = varying_keys([r for v in variants for r in v.runs])
    flat = {v.label: flatten(v.config) for v in variants}
    keys = set().union(*flat.values())
    if unknown := [k for k in spec if k not in keys]:  # a typo would otherwise match no run, or (ignored) every run
        close = difflib.get_close_matches(unknown[0], keys, n=1)
        raise RunsError(
            f"reference key {unknown[0]}: no run's config.yaml has it"
            + (f" (did you mean {close[0]}?)" if close else "")
            + "; pass --reference with keys of config.yaml, e.g. model.norm=rmsnorm"
        )
    candidates = [v for v in variants if all(_same(flat[v.label].get(k), value) for k, value in spec.items())]
    found = {}
    for v in variants:
        context = [k for k in varying if k not in spec]
        found[v.label] = next(
            (c for c in candidates if all(_same(flat[c.label].get(k), flat[v.label].get(k)) for k in context)), None
        )
    return found


def versus_reference(variants: Sequence[Variant], references: Dict[str, Optional[Variant]]) -> List[Versus]:
    """The comparisons to report: every variant with a reference other than itself."""
    return [
        Versus(v, references[v.label], compare(final_bpb(v), final_bpb(references[v.label])))
        for v in variants
        if references.get(v.label) is not None and references[v.label] is not v
    ]


def markdown(pairs: Sequence[Versus], unit: str = "bpb") -> str:
    """The paired-Δ table (Welch's figures beside) and one verdict sentence per variant."""
    if not pairs:
        return ""
    several = len({p.reference.label for p in pairs}) > 1
    header = (
        ["variant"]
        + (["reference"] if several else [])
        + [
            "paired seeds",
            f"Δ {unit} (paired)",
            CI,
            "p (paired t)",
            f"Δ {unit} (Welch)",
            f"{CI} (Welch)",
            "p (Welch)",
            "verdict",
        ]
    )
    rows = [
        [p.variant.label]
        + ([p.reference.label] if several else [])
        + [str(len(p.comparison.common_seeds))]
        + _cells(p.comparison.paired)
        + _cells(p.comparison.unpaired)
        + [OUTCOME_WORDS[p.comparison.outcome]]
        for p in pairs
    ]
    lines = table_lines(header, rows)
    reference = "its reference" if several else pairs[0].reference.label
    lines += [
        "",
        f"Δ = variant − {reference} in final val {unit} (negative = the variant is better); the {CI} is "
        "Student's t over the per-seed differences (paired) or Welch's over the two groups."
        + (
            ""
            if len(pairs) < 2
            else f" With {len(pairs)} comparisons at 5 % each, about one in twenty "
            "'better'/'worse' calls on a true tie is expected by chance."
        ),
        "",
    ]
    lines += [
        f"- **{p.variant.label}**" + (f" vs {p.reference.label}" if several else "") + f": {p.comparison.verdict(unit)}"
        for p in pairs
    ]
    return "\n".join(lines) + "\n"


def _cells(t: Optional[TTest]) -> List[str]:
    if t is None:
        return ["n/a", "n/a", "n/a"]
    if math.isnan(t.low):
        return [f"{t.delta:+.4f}", "n/a", "n/a"]
    return [f"{t.delta:+.4f}", f"[{t.low:+.4f}, {t.high:+.4f}]", format_p(t.p)]


def _same(a, b) -> bool:
    """Config values equal as numbers when both are numbers, else as case-insensitive text (true/True)."""
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-12)
    except (TypeError, ValueError):
        return str(a).lower() == str(b).lower()
