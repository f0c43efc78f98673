"""What the protocol will cost: seconds per run at each size (lab/sweep.py: measured throughput through the
project's one cost model), times the number of runs still to do."""

from dataclasses import dataclass
from typing import Dict, List, Optional

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
