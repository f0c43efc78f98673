"""The checkpoint package's errors: each a ValueError, so train.py and the scripts print it as one `error:` line."""
from pathlib import Path
from typing import Optional


class CheckpointError(ValueError):
    """A checkpoint path that is missing, incomplete, corrupt or does not fit the model."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (disk full, file-size limit, permissions): nothing was kept or pruned."""


class NonFiniteCheckpoint(CheckpointError):
    """The weights or optimizer state hold NaN/inf: nothing was written. `last_good` is the newest
    checkpoint a run can go back to."""

    def __init__(self, message: str, last_good: Optional[Path]):
        super().__init__(message)
        self.last_good = last_good


def first_line(error: BaseException) -> str:
    """An exception's first line of text (its type name if it has none), at most 200 characters."""
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]
