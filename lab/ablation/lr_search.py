"""Honest learning-rate selection for one (variant, size): the lowest final bpb over a log-spaced grid on a seed of its
own, a near-tie to the smaller LR; a best LR at the grid's edge adds a point beyond it, up to a stated cap."""

import math
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence

Results = Dict[float, Optional[float]]  # LR → final val bpb of a finished run; None = diverged


@dataclass(frozen=True)
class Sweep:
    lrs: List[float]  # every LR of the sweep so far, ascending: the grid, then its extensions
    pending: List[float]  # LRs of `lrs` without a result yet: the sweep is not settled
    best: Optional[float]  # the chosen LR once settled; None while pending or when every LR diverged
    extensions: int  # points added beyond the grid
    capped: bool  # settled at the edge because the cap was reached: the optimum may lie further out

    @property
    def settled(self) -> bool:
        return not self.pending


def finite_results(final_bpb: Results) -> Results:
    return {lr: bpb for lr, bpb in final_bpb.items() if bpb is not None and math.isfinite(bpb)}


def choose_lr(final_bpb: Results, tolerance: float = 0.0) -> Optional[float]:
    """The LR with the lowest final val bpb among the runs that finished with a finite value (diverged runs
    are None); None when no LR did. A near-tie — within `tolerance` bpb of the lowest (the spec's
    lr_tie_tolerance, stated before the run) — goes to the smaller, safer LR: one stage-1 seed cannot tell
    LRs that close apart."""
    finite = finite_results(final_bpb)
    if not finite:
        return None
    lowest = min(finite.values())
    return min(lr for lr, bpb in finite.items() if bpb <= lowest + tolerance)


def margin(final_bpb: Results, chosen: Optional[float]) -> Optional[float]:
    """How much lower the chosen LR's bpb is than the best other finite LR's (negative when a near-tie went
    to the smaller LR); None without a chosen LR or a finite rival."""
    finite = finite_results(final_bpb)
    rivals = [bpb for lr, bpb in finite.items() if lr != chosen]
    return None if chosen not in finite or not rivals else min(rivals) - finite[chosen]


def at_grid_edge(lr: float, grid: Sequence[float]) -> bool:
    """The LR is the smallest or largest tried: the optimum may lie outside the grid."""
    return len(grid) > 1 and lr in (min(grid), max(grid))


def beyond(lrs: Sequence[float], upward: bool) -> float:
    """The next LR past the grid's edge, at the spacing of the edge's last step (6 significant digits,
    so 2e-3 · 2 is 0.004 and names the same run directory every time)."""
    lrs = sorted(lrs)
    lr = lrs[-1] * lrs[-1] / lrs[-2] if upward else lrs[0] * lrs[0] / lrs[1]
    return float(f"{lr:.6g}")


def sweep(grid: Sequence[float], results: Results, cap: int, tolerance: float = 0.0) -> Sweep:
    """Where the sweep of one (size, variant) stands, given the results so far. Deterministic in the
    results, so a resumed protocol finds the same extensions. Everything diverging counts as an
    edge too: the next point is below the smallest LR."""
    lrs = sorted(grid)
    while True:
        pending = [lr for lr in lrs if lr not in results]
        if pending:
            return Sweep(lrs, pending, None, len(lrs) - len(grid), False)
        best = choose_lr({lr: results[lr] for lr in lrs}, tolerance)
        edge = len(lrs) > 1 and (best is None or at_grid_edge(best, lrs))
        if not edge:
            return Sweep(lrs, [], best, len(lrs) - len(grid), False)
        if len(lrs) - len(grid) >= cap:
            return Sweep(lrs, [], best, len(lrs) - len(grid), True)
        lrs = sorted([*lrs, beyond(lrs, upward=best is not None and best == max(lrs))])


def edge_note(s: Sweep, cap: int) -> str:
    """What the report says about a settled sweep's choice: '' when interior."""
    if s.best is None:
        return f"diverged at every LR, down to {min(s.lrs):g}"
    extended = f" after {s.extensions} extension(s)" if s.extensions else ""
    if s.capped:
        return f"⚠ still at the grid's edge{extended} (cap {cap}): the optimum may lie further out"
    return f"interior{extended}"
