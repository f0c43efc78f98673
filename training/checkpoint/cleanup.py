"""Tidying a checkpoints folder: what a killed save left behind, and the later steps of an abandoned branch.

Both belong at the start of a run, on rank 0, before anything writes into the folder.
"""
import os
import shutil
import time
from pathlib import Path
from typing import List

from training.checkpoint.errors import CheckpointError
from training.checkpoint.format import checkpoint_name, checkpoint_step, list_checkpoints
from training.runtime.run_files import STATE

ABANDONED_PREFIX = "abandoned-"


def clean_partial_checkpoints(ckpt_root: Path) -> List[Path]:
    """Remove the `step_N.tmp` dirs a kill left mid-save (here and in subfolders such as `best/`), and
    restore a `step_N.old` whose re-save was killed between its two renames. Call at start, before
    anything writes. Returns what was removed."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    removed = []
    for folder in [root] + [p for p in root.iterdir() if p.is_dir() and checkpoint_step(p) is None]:
        for leftover in sorted(folder.glob("step_*.old")):
            complete = leftover.with_suffix("")
            if not (complete / STATE).exists():
                shutil.rmtree(complete, ignore_errors=True)
                os.replace(leftover, complete)
            else:
                shutil.rmtree(leftover, ignore_errors=True)
                removed.append(leftover)
        for leftover in sorted(folder.glob("step_*.tmp")):
            shutil.rmtree(leftover, ignore_errors=True)
            removed.append(leftover)
    return removed


def move_aside_later_checkpoints(ckpt_root: Path, step: int) -> List[Path]:
    """Move the checkpoints after `step` (here and in `best/`) into `abandoned-<time>/`: resuming from
    an older checkpoint starts a new branch, and `resume=<run dir>`, `latest` and keep_last must not
    pick the old branch's later steps. Returns the new locations; nothing is deleted."""
    root = Path(ckpt_root)
    if not root.is_dir():
        return []
    folders = [root] + [p for p in root.iterdir()
                        if p.is_dir() and checkpoint_step(p) is None and not p.name.startswith(ABANDONED_PREFIX)]
    later = [c for folder in folders for c in list_checkpoints(folder) if checkpoint_step(c) > step]
    if not later:
        return []
    aside = _claim_dir(root / f"{ABANDONED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}")
    (aside / "README.txt").write_text(f"Checkpoints after {checkpoint_name(step)}, moved here when the run resumed "
                                      f"from {checkpoint_name(step)} on {time.strftime('%Y-%m-%d %H:%M:%S')}.\n")
    moved = []
    for ckpt in later:
        target = aside / ckpt.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(ckpt, target)
        moved.append(target)
    return moved


def _claim_dir(path: Path) -> Path:
    """Create `path`, or `path-2`, `path-3`, … if taken: never share a directory with another call."""
    for n in range(1, 1000):
        candidate = path if n == 1 else path.with_name(f"{path.name}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise CheckpointError(f"cannot create a folder next to {path}: 999 names taken")
