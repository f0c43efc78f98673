"""Owning a run directory: claimed atomically, so two runs never write into the same one.

Hydra names a run directory after the current second and creates it before train.py runs, so two
runs started in the same second (or two sweeps' job 0) get the same path. Ownership is a claim
file created with O_EXCL — atomic on local filesystems and NFSv3+ — and the loser moves to a
fresh sibling (`<dir>-1`, `<dir>-2`, …) that it creates itself with an exclusive mkdir. While a
run lives it also holds an advisory lock (flock) on that file, so a `resume=` of a directory that
a live process is training in is refused instead of interleaving two runs.
"""
import fcntl
import json
import os
import re
import socket
import sys
import time
from pathlib import Path
from typing import Optional, Tuple

from training.runtime import distributed as D
from training.runtime.run_files import CLAIM as CLAIM_FILE, CONFIG, RunFiles


class RunDirBusy(ValueError):
    """The run directory is being trained in by a live process."""


class RunDirClaim:
    """The open, locked claim file of the run directory this process owns."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir, self._fd = run_dir, fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None


def claim_new(run_dir: Path, max_tries: int = 1000) -> RunDirClaim:
    """Own `run_dir` if nobody does, else the first free `<run_dir>-N`; returns the claim.

    A new run never writes into a directory that holds (or is starting) another run, whether the
    name came from the clock or from hydra.run.dir; resuming a run is `resume=<dir>`.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)  # Hydra made it already; another run may own it
    claim = None if RunFiles(run_dir).holds_run() else _try_claim(run_dir)
    for n in range(1, max_tries):
        if claim is not None:
            return claim
        sibling = run_dir.with_name(f"{run_dir.name}-{n}")
        try:
            sibling.mkdir()  # exclusive: if it exists, someone else made it
        except FileExistsError:
            continue
        claim = _try_claim(sibling)
    raise RunDirBusy(f"could not claim a run directory next to {run_dir} after {max_tries} tries; "
                     "set hydra.run.dir to a fresh path")


def claim_existing(run_dir: Path) -> RunDirClaim:
    """Take over a run directory to resume it; refuse while a live process still trains in it."""
    path = Path(run_dir) / CLAIM_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        owner = _read_owner(path)
        os.close(fd)
        raise RunDirBusy(f"{run_dir} is in use by a live run ({owner}); wait for it to stop, or resume "
                         "another run directory") from None
    _write_owner(fd)
    return RunDirClaim(Path(run_dir), fd)


def _try_claim(run_dir: Path) -> Optional[RunDirClaim]:
    try:
        fd = os.open(run_dir / CLAIM_FILE, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return None
    fcntl.flock(fd, fcntl.LOCK_EX)  # nobody else can hold it: we just created the file
    _write_owner(fd)
    return RunDirClaim(run_dir, fd)


def _write_owner(fd: int) -> None:
    owner = {"pid": os.getpid(), "host": socket.gethostname(), "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    os.ftruncate(fd, 0)
    os.pwrite(fd, (json.dumps(owner) + "\n").encode(), 0)


def _owner(path: Path) -> Optional[dict]:
    """The claim file's owner, or None while it is gone or created and not yet written."""
    try:
        owner = json.loads(path.read_text())
        return owner if isinstance(owner, dict) and {"pid", "host", "since"} <= owner.keys() else None
    except (OSError, ValueError):
        return None


def _read_owner(path: Path) -> str:
    owner = _owner(path)
    return f"pid {owner['pid']} on {owner['host']} since {owner['since']}" if owner else "owner unknown"


def _claimed_by_this_process(path: Path) -> bool:
    owner = _owner(path)
    return owner is not None and owner["pid"] == os.getpid() and owner["host"] == socket.gethostname()


def claim_for_run(hydra_dir: Path, resumed_run: Optional[Path], info: D.DistInfo) -> Tuple[Path, Optional[RunDirClaim]]:
    """(run directory, claim). Rank 0 claims — the resumed run's directory, or Hydra's (a sibling if another
    run owns it) — and every rank takes rank 0's choice (they may start seconds apart)."""
    claim = None
    if info.is_main:
        if resumed_run is not None:
            claim = claim_existing(resumed_run)
        else:
            claim = claim_new(hydra_dir)
            if claim.run_dir != hydra_dir:
                print(f"run dir {hydra_dir} belongs to another run (started the same second, or named twice): "
                      f"using {claim.run_dir}", file=sys.stderr)
    run_dir = D.broadcast_object(claim.run_dir if claim else None, info)
    if run_dir != hydra_dir:  # a resume, a rank that started a second later, or another run's directory (kept)
        discard_if_unused(hydra_dir)  # Hydra made a directory this run does not use
    return run_dir, claim


def discard_if_unused(path: Path, failed_start: bool = False) -> None:
    """Remove a run directory that holds nothing but this process's claim file and empty logs (the directory
    Hydra made for a resume that continues elsewhere) — or, after a failed start, also its config.yaml and
    the logs of the failure, since no training happened — and then its date folder if that is left empty.
    Another run's claim — even one being written, still empty — keeps the directory: a run started in the
    same second may own it and not have written anything else yet. Checkpoints and metrics always keep it."""
    path = Path(path)
    if not path.is_dir() or ((path / CLAIM_FILE).exists() and not _claimed_by_this_process(path / CLAIM_FILE)):
        return
    entries = list(path.iterdir())
    disposable = (lambda p: p.suffix == ".log" or p.name == CONFIG) if failed_start else \
        (lambda p: p.suffix == ".log" and not p.stat().st_size)
    if any(p.is_dir() or (p.name != CLAIM_FILE and not disposable(p)) for p in entries):
        return
    for p in entries:
        p.unlink(missing_ok=True)
    try:
        path.rmdir()
        if DATE_FOLDER.fullmatch(path.parent.name) and not any(path.parent.iterdir()):
            path.parent.rmdir()  # outputs/<date>/ that held only this directory
    except OSError:  # something appeared meanwhile: keep it
        pass


DATE_FOLDER = re.compile(r"\d{4}-\d{2}-\d{2}")  # Hydra's outputs/${now:%Y-%m-%d}
