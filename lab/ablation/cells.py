"""Where each protocol cell stands, read from its run directory: finished, diverged, failed,
resumable from a checkpoint, to be restarted, or not started."""

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from analysis.runs import Run, RunsError, read_run
from lab.ablation.protocol import Cell, ProtocolError, Spec, lr_sweep, stage1_cells
from lab.launcher import move_aside as move_run_aside
from training.checkpoint import RunFiles

# job_status.yaml is written into the run directory at the end of every job by lab/launcher.py (a Hydra
# callback): whether the job completed or failed, and why. A job stopped by a signal writes none.

FINISHED, DIVERGED, FAILED, RESUMABLE, RESTART, MISSING = (
    "finished",
    "diverged",
    "failed",
    "resumable",
    "restart",
    "missing",
)
DONE = (FINISHED, DIVERGED)  # never run again: a diverged cell would diverge again (same seed, same data)


@dataclass
class CellState:
    cell: Cell
    path: Path
    state: str
    run: Optional[Run] = None  # read whenever metrics exist
    error: str = ""  # the job's one-line error (failed / diverged)

    @property
    def final_bpb(self) -> Optional[float]:
        """Final val bpb of a finished cell; None for anything else (diverged included)."""
        if self.state != FINISHED:
            return None
        value = self.run.final.get("val_bpb")
        return value if value is not None and math.isfinite(value) else None


def inspect(cell: Cell, runs_dir: Path) -> CellState:
    path = runs_dir / cell.run_name
    status = RunFiles(path).read_job_status() or {}
    run = _read_run(path)
    if status.get("status") == "FAILED":
        return CellState(cell, path, DIVERGED if is_divergence(status) else FAILED, run, status.get("error", ""))
    if run is not None and run.complete:
        return CellState(cell, path, FINISHED, run)
    if _has_checkpoint(path):
        return CellState(cell, path, RESUMABLE, run)
    return CellState(cell, path, RESTART if path.exists() else MISSING, run)


def file_digests(path: Path) -> Dict[str, str]:
    """{file: SHA-256, 16 hex} of every file in a run directory but its checkpoints: what its results derive from."""
    checkpoints = RunFiles(path).checkpoints
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()[:16]
        for p in sorted(path.rglob("*"))
        if p.is_file() and checkpoints not in p.parents
    }


def check_files(recorded: Dict[str, dict], runs_dir: Path, where) -> None:
    """A ProtocolError naming the first file of a done cell's run directory that changed since the manifest recorded
    it (a result edited by hand would otherwise be derived from); a cell whose directory is gone runs again."""
    for name, entry in recorded.items():
        path = runs_dir / name
        if not (entry.get("files") and path.is_dir()):
            continue
        now = file_digests(path)
        for file, digest in entry["files"].items():
            if now.get(file) != digest:
                raise ProtocolError(
                    f"{path / file} {'changed' if file in now else 'is gone'} since {where} recorded its cell as "
                    f"{entry['state']}; restore it (git, a backup), or delete {path} to run the cell again"
                )


def is_divergence(status: dict) -> bool:
    """A training-time non-finite loss or gradient (train.py's NonFiniteLoss), not a crash or a bad config."""
    return "NonFiniteLoss" in status.get("error_types", []) or "non-finite" in status.get("error", "").lower()


def move_aside(state: CellState, discarded_dir: Path) -> Path:
    """Keep a failed or checkpoint-less partial run out of the way (never delete it) before its
    cell runs again: <protocol>/discarded/<time>/<run_name>."""
    return move_run_aside(state.path, discarded_dir, state.cell.run_name)


def _read_run(path: Path) -> Optional[Run]:
    if not RunFiles(path).is_complete():
        return None
    try:
        return read_run(path)
    except RunsError:  # cut off mid-write by a kill: the run restarts or resumes from its checkpoint
        return None


def _has_checkpoint(path: Path) -> bool:
    ckpts = RunFiles(path).checkpoints
    return ckpts.is_dir() and any(p.name.startswith("step_") for p in ckpts.iterdir())


def done_bpb(states: Dict[Cell, CellState]) -> Dict[Cell, Optional[float]]:
    """{cell: final bpb} of the cells that will not run again (None = diverged): what LR sweeps read."""
    return {c: s.final_bpb for c, s in states.items() if s.state in DONE}


def stage1_states(spec: Spec, inspect_cells: Callable[[List[Cell]], Dict[Cell, CellState]]) -> Dict[Cell, CellState]:
    """The states of every stage-1 cell: the grid's, then the extensions its results call for, then
    theirs, until no new cell appears (an extension not yet run is MISSING and ends the walk)."""
    cells = stage1_cells(spec)
    while True:
        states = inspect_cells(cells)
        more = [c for c in stage1_cells(spec, done_bpb(states)) if c not in states]
        if not more:
            return states
        cells = [*cells, *more]


def chosen_lrs(spec: Spec, states: Dict[Cell, CellState]) -> Dict[str, Dict[str, Optional[float]]]:
    """{size: {variant: best stage-1 LR}} for the variants whose LR sweep is settled (every LR done and
    no extension called for); None for a variant that diverged at every LR. Variants still sweeping are
    left out. Under transfer_from every size takes the transfer size's choices (μP: the same best LR)."""
    done, chosen = done_bpb(states), {size: {} for size in spec.sizes}
    for size in spec.sweep_sizes:
        for variant in spec.variants_at(size):
            sweep = lr_sweep(spec, size, variant, done)
            if sweep.settled:
                chosen[size][variant] = sweep.best
    if spec.transfer_from:
        tuned = chosen[spec.transfer_from]
        for size in spec.sizes:
            chosen[size] = {v: tuned[v] for v in spec.variants_at(size) if v in tuned}
    return chosen
