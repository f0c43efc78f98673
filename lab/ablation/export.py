"""Every number of the report, traceable: per_seed.csv (every cell: stage, size, variant, LR, seed, state,
final val loss and bpb, tokens, what it trained in), contrasts.csv (every contrast with its per-seed differences, raw and adjusted
p-values, TOST) and results.json (both, with the spec and the chosen LRs), beside results.md."""

import csv
import json
import math
from pathlib import Path
from typing import Dict, List, Optional

from lab.ablation.contrasts import Contrast
from lab.ablation.protocol import Cell, CellState, Spec

CELL_FIELDS = ["stage", "size", "variant", "lr", "seed", "state", "val_loss", "val_bpb", "tokens", "precision"]
CONTRAST_FIELDS = [
    "lr_choice",
    "family",
    "size",
    "variant",
    "reference",
    "lr",
    "reference_lr",
    "seeds",
    "delta",
    "ci_low",
    "ci_high",
    "p",
    "p_adjusted",
    "tost_p_lower",
    "tost_p_upper",
    "tost_p_adjusted",
    "verdict",
    "p_study_wide",
    "per_seed_delta",
]


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


def write(
    out: Path, spec: Spec, states: Dict[Cell, CellState], chosen: dict, contrasts: List[Contrast], registered: str = ""
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
