"""Where each protocol cell stands: its run directory's state (lab/sweep.py), the LR sweeps' cells and choices."""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

from lab.ablation.protocol import Cell, ProtocolError, Spec, lr_sweep, stage1_cells
from lab.sweep import DONE, State, file_digests
from lab.sweep import inspect as inspect_dir


@dataclass
class CellState(State):
    cell: Optional[Cell] = None


def inspect(cell: Cell, runs_dir: Path) -> CellState:
    return CellState(**vars(inspect_dir(runs_dir / cell.run_name)), cell=cell)


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
