"""metrics.jsonl, the run's one metrics file: rows appended as JSON lines while training, rewound on
resume (by the checkpoint package's Resume, with the rest of a run's position), read by the studies (analysis/) and the tools. This module is the only one that writes or parses it."""
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, List

from training.checkpoint.write_errors import WriteError, write_error_cause
from training.runtime.run_files import RunFiles


class MetricsError(ValueError):
    """metrics.jsonl is corrupt before its last line (a cut-off last line is only a warning)."""


class MetricsFile:
    """The run directory's metrics.jsonl, open for appending (line-buffered: a kill loses at most one row)."""

    def __init__(self, run_dir: Path):
        self.path = RunFiles(run_dir).metrics
        self.failed = False  # a write was refused: said once, in one line
        try:
            self.file = open(self.path, "a", buffering=1)
        except OSError as e:
            raise WriteError(f"cannot write metrics: {write_error_cause(e, self.path)}") from e

    def append(self, row: dict) -> dict:
        """Write one row, stamped with the wall-clock time; returns the row as written."""
        row = {"time": time.time(), **row}
        try:
            self.file.write(json.dumps(row) + "\n")
        except OSError as e:  # full disk, quota, …: one line, not a traceback from inside the loop
            self.failed = True
            raise WriteError(f"cannot write metrics: {write_error_cause(e, self.path)}") from e
        return row

    def close(self) -> None:
        """Close the file. After a refused write, closing flushes the same unwritten line into the same full
        disk: that second failure is the first one again, and must not bury its one-line error."""
        try:
            self.file.close()
        except OSError as e:
            if not self.failed:
                raise WriteError(f"cannot write metrics: {write_error_cause(e, self.path)}") from e

def rewind_metrics(run_dir: Path, step: int) -> None:
    """A resume's metrics position: the rows after `step` go (the resumed run logs those steps again). Rewritten
    under a temp name and renamed, so a kill now cannot lose the rows it keeps."""
    path = RunFiles(run_dir).metrics
    if not path.exists():
        return
    rows = [row for row in read_metrics(path) if row.get("step", 0) <= step]
    temp = path.with_name(path.name + ".tmp")
    try:
        temp.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(temp, path)
    except OSError as e:
        raise WriteError(f"cannot write metrics: {write_error_cause(e, path)}") from e


def read_metrics(path: Path, warn: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> List[dict]:
    """The rows of a metrics.jsonl. A kill -9 can cut the last line mid-JSON: that line is dropped with
    a warning (its step is logged again on resume). A broken line before the last is corruption: an error."""
    lines = [(n, line) for n, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1) if line.strip()]
    rows = []
    for i, (n, line) in enumerate(lines):
        try:
            row = json.loads(line)
        except ValueError:
            row = None
        if isinstance(row, dict):
            rows.append(row)
        elif i == len(lines) - 1:
            warn(f"warning: {path}: dropped its cut-off last line {n} (the run was killed while writing it)")
        else:
            raise MetricsError(f"{path} line {n} is not a JSON object ({line[:40]!r}) but more rows follow it; "
                               "the file is corrupt: fix or delete that line, then resume")
    return rows
