"""What the protocol will cost and can detect: seconds per run at each size (lab/sweep.py) × runs still to do, and the
minimum detectable effect of the planned seeds in each family, from the spread of per-seed paired differences — the
spec's planning_sd, or one measured in a pilot protocol's manifest (the stored default: docs/ablation/protocol/)."""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import yaml

from lab import stats as power
from lab.ablation.protocol import TIERS, ProtocolError, Spec

SWEEP_STARTUP_S = 10.0  # one `train.py -m` process per stage: imports, data cache lookup


@dataclass
class Line:
    size: str
    params: int  # the reference's parameters at this size
    seconds: Optional[float]  # per run; None = not measured
    stage1: int  # runs to do
    stage2: int

    @property
    def total_s(self) -> Optional[float]:
        return None if self.seconds is None else self.seconds * (self.stage1 + self.stage2)


def table(lines: List[Line], source: str, done: int, stages: int) -> str:
    """The cost, printed before anything trains and written into the manifest."""
    w = max(10, *(len(line.size) + 1 for line in lines))
    out = [f"{'size':<{w}} {'params':>8} {'per run':>9} {'stage 1':>8} {'stage 2':>8} {'time':>10}"]
    for line in lines:
        out.append(
            f"{line.size:<{w}} {line.params / 1e6:>7.2f}M {_s(line.seconds):>9} {line.stage1:>8} "
            f"{line.stage2:>8} {_min(line.total_s):>10}"
        )
    runs = sum(line.stage1 + line.stage2 for line in lines)
    known = [line.total_s for line in lines]
    sweeps = (any(x.stage1 for x in lines) + any(x.stage2 for x in lines)) if stages == 2 else stages
    total = None if None in known else sum(known) + sweeps * SWEEP_STARTUP_S
    out.append(
        f"{'total':<{w}} {'':>8} {'':>9} {sum(x.stage1 for x in lines):>8} "
        f"{sum(x.stage2 for x in lines):>8} {_min(total):>10}"
    )
    out.append(f"{runs} runs to do ({done} already finished or diverged); per-run time from {source}")
    return "\n".join(out)


def transfer_saving(spec, seconds: Dict[str, Optional[float]]) -> dict:
    """What transfer_from saves: the LR grid's runs at every other size, which stage 1 then never trains
    ({} without transfer_from). Extensions past an edge would have cost more; they are not counted."""
    if not spec.transfer_from:
        return {}
    skipped = {
        size: len(spec.variants_at(size)) * len(spec.lr_grid) for size in spec.sizes if size != spec.transfer_from
    }
    known = all(seconds.get(size) is not None for size in skipped)
    minutes = sum(n * seconds[size] for size, n in skipped.items()) / 60 if known else None
    text = (
        f"transfer_from {spec.transfer_from} (μP): stage 1 sweeps LRs only there and every size reuses them; "
        f"{sum(skipped.values())} grid runs at {', '.join(skipped) or 'no other size'} are not trained, saving "
        + ("? min (no timing yet)" if minutes is None else f"{minutes:.1f} min")
        + " (extensions not counted)"
    )
    return {"text": text, "runs": sum(skipped.values()), "minutes": None if minutes is None else round(minutes, 1)}


def _s(seconds: Optional[float]) -> str:
    return "?" if seconds is None else f"{seconds:.0f} s"


def _min(seconds: Optional[float]) -> str:
    return "?" if seconds is None else f"{seconds / 60:.1f} min"


def summary(lines: List[Line]) -> Dict[str, dict]:
    """The cost as the manifest stores it."""
    return {
        line.size: {
            "seconds_per_run": None if line.seconds is None else round(line.seconds, 1),
            "stage1_runs": line.stage1,
            "stage2_runs": line.stage2,
        }
        for line in lines
    }


RUN_NAME = re.compile(r"^(?P<size>[^/]+)/(?P<variant>[^/]+)/lr(?P<lr>[^_/]+)_seed(?P<seed>\d+)$")


def manifest_values(manifest: dict) -> Dict[Tuple[str, str, float], Dict[int, float]]:
    """{(size, variant, lr): {seed: final val bpb}} of a manifest's finished cells."""
    values = {}
    for name, cell in (manifest.get("cells") or {}).items():
        m = RUN_NAME.match(name)
        if m and isinstance(cell, dict) and cell.get("val_bpb") is not None:
            key = (m["size"], m["variant"], float(m["lr"]))
            values.setdefault(key, {})[int(m["seed"])] = float(cell["val_bpb"])
    return values


def paired_differences(manifest: dict, variants: Sequence[str]) -> Dict[str, List[float]]:
    """{'size/variant': per-seed (variant − reference) bpb} on the manifest's measuring seeds, each variant
    at its chosen LR against the reference at its own: the spread a study's paired tests see."""
    spec, chosen = manifest["spec"], manifest.get("chosen_lr") or {}
    values, seeds, reference = manifest_values(manifest), set(spec["seeds"]), spec["reference"]
    diffs = {}
    for size, per_size in chosen.items():
        if per_size.get(reference) is None:
            continue
        ref = values.get((size, reference, float(per_size[reference])), {})
        for variant in variants:
            if per_size.get(variant) is None:
                continue
            mine = values.get((size, variant, float(per_size[variant])), {})
            common = sorted(seeds & set(mine) & set(ref))
            if len(common) >= 2:
                diffs[f"{size}/{variant}"] = [mine[s] - ref[s] for s in common]
    return diffs


def spread_from(path: Path, variants: Optional[Sequence[str]] = None) -> Tuple[float, int, str]:
    """(pooled sd of paired differences, its degrees of freedom, where from) of a pilot protocol: its
    directory or its protocol.yaml. Variants: the manifest's primaries, else every non-reference one."""
    file = path / "protocol.yaml" if path.is_dir() else path
    try:
        manifest = yaml.safe_load(file.read_text())
        spec = manifest["spec"]
    except (OSError, yaml.YAMLError, TypeError, KeyError) as e:
        raise ProtocolError(
            f"--spread-from {path}: not a protocol manifest ({type(e).__name__}); pass a protocol "
            "directory or its protocol.yaml"
        )
    variants = list(variants or spec.get("primary") or [v for v in spec["variants"] if v != spec["reference"]])
    diffs = paired_differences(manifest, variants)
    sd = power.pooled_sd(diffs)
    if sd is None:
        raise ProtocolError(
            f"--spread-from {path}: no variant of {', '.join(variants)} has two paired seeds with "
            f"the reference; finish its stage 2 first"
        )
    return sd, power.pooled_dof(diffs), f"{file}: {', '.join(sorted(diffs))}"


def power_table(spec: Spec, sd: Optional[float], source: str) -> str:
    """Per family: its size, the strictest Holm level, the planned seeds and their MDE at 80 % power."""
    if sd is None:
        return "power: no planning spread (set planning_sd or pass --spread-from a pilot): MDE unknown"
    lines = [
        f"power: two-sided paired t-test, {spec.power:.0%} power, at each family's strictest Holm level "
        f"α/m; spread of per-seed paired differences sd = {sd:.4f} bpb ({source})",
        f"{'family':<10} {'contrasts':>22} {'α/m':>8} {'seeds':>6} {'MDE':>11} {'MDE/sd':>7}",
    ]
    for tier in TIERS:
        members = spec.family(tier)
        if not members:
            continue
        a = spec.family_alpha(tier)
        m = f"{len(members)} variant(s), {len(spec.family_tests(tier))} tests"
        mde = power.mde(sd, len(spec.seeds), a, spec.power)
        lines.append(f"{tier:<10} {m:>22} {a:>8.4f} {len(spec.seeds):>6} {mde:>7.4f} bpb {mde / sd:>7.2f}")
    needed = power.seeds_for(spec.target_mde, sd, spec.family_alpha("primary"), spec.power)
    lines.append(
        f"target: primary MDE ≤ {spec.target_mde:g} bpb needs "
        + (f"{needed} seeds" if needed else f"more than {power.MAX_SEEDS} seeds")
        + f" at this spread; planned {len(spec.seeds)}"
        + (
            ""
            if needed and needed <= len(spec.seeds)
            else " (the target is not met: read 'can't tell' as 'too few seeds', never as 'the same')"
        )
        + "; the MDE is proportional to the spread (MDE/sd), which longer runs may shrink"
    )
    return "\n".join(lines)
