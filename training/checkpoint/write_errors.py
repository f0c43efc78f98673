"""Why a write failed, in one line: disk full, file-size limit, permissions, read-only disk, quota.

torch.save reports every failed write as `[enforce fail at inline_container.cc:…] . unexpected pos …`
and safetensors as `I/O error: … (os error 28)`, so the cause is taken from the errno where the
library keeps it (OSError, or the file object's own error: see `ErrnoRecordingFile`), from the
message's `os error N` otherwise, and as a last resort from the disk's free space and `ulimit -f`.
"""
import errno
import os
import re
import resource
from pathlib import Path
from typing import Optional

from training.checkpoint.errors import first_line

# Below this much free space, a failed write on that disk is taken to be "disk full".
NEARLY_FULL_BYTES = 1 << 20
TORCH_WRITE_FAILURES = ("unexpected pos", "file write failed", "PytorchStreamWriter failed")


class WriteError(ValueError):
    """A write the user's environment refused (full disk, limits, permissions): one line, with the fix."""


class ErrnoRecordingFile:
    """A file wrapper for torch.save: torch turns the OSError of a failed write into a RuntimeError
    without the errno, so the wrapper keeps the original error for `write_error_cause`."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data) -> int:
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self.file.flush()


def is_write_failure(error: BaseException) -> bool:
    """Whether `error` is the environment refusing a write (as opposed to a bug of ours)."""
    if isinstance(error, OSError):
        return True
    text = str(error)
    return bool(re.search(r"os error \d+", text)) or any(s in text for s in TORCH_WRITE_FAILURES)


def write_error_cause(error: BaseException, path: Path, folder: Optional[Path] = None) -> str:
    """`<cause> while writing <path>; <what to do>` for a failed write of `path`. The advice names
    `folder` (default: the file's own), e.g. the checkpoints folder rather than a deleted `.tmp`."""
    code = _errno_of(error, path)
    where = Path(folder) if folder is not None else Path(path).parent
    if code == errno.ENOSPC:
        cause, fix = "no space left on device", f"free space on the disk holding {where} (or lower trainer.keep_last)"
    elif code == errno.EFBIG:
        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY:
            cause = f"the file-size limit (ulimit -f: {limit:,} bytes) was reached"
            fix = "raise it (`ulimit -f unlimited`, or the job scheduler's file-size limit)"
        else:
            cause, fix = "file too large for the file system", f"write the run to another file system than {where}'s"
    elif code in (errno.EACCES, errno.EPERM):
        cause = "permission denied"
        fix = f"make {where} writable for this user, or write the run elsewhere (hydra.run.dir=…)"
    elif code == errno.EROFS:
        cause, fix = "read-only file system", "write the run to a writable directory (hydra.run.dir=…)"
    elif code == errno.EDQUOT:
        cause, fix = "disk quota exceeded", "free space within your quota (or lower trainer.keep_last)"
    elif code == errno.ENOENT:
        cause = f"{where} disappeared"
        fix = "another process removed it: is a second run writing into this run directory?"
    elif code == errno.EIO:
        cause, fix = "I/O error", "the disk may be failing: check it (dmesg) and write the run elsewhere"
    elif code is not None:
        cause, fix = os.strerror(code).lower(), "fix the disk or write the run elsewhere (hydra.run.dir=…)"
    else:
        cause = f"write failed ({first_line(error)})"
        fix = "check the disk, or write the run elsewhere (hydra.run.dir=…)"
    return f"{cause} while writing {path}; {fix}"


def _errno_of(error: BaseException, path: Path) -> Optional[int]:
    seen = error
    while seen is not None:  # the OSError may sit in the chain (`raise … from e`)
        if isinstance(seen, OSError) and seen.errno is not None:
            return seen.errno
        seen = seen.__cause__
    match = re.search(r"os error (\d+)", str(error))  # safetensors (Rust's io::Error)
    if match:
        return int(match.group(1))
    if any(s in str(error) for s in TORCH_WRITE_FAILURES):
        return _guess_errno(Path(path))
    return None


def _guess_errno(path: Path) -> Optional[int]:
    """No errno kept: a (nearly) full disk means ENOSPC, a finite `ulimit -f` EFBIG."""
    folder = next((p for p in (path, *path.parents) if p.exists()), None)
    if folder is not None:
        stats = os.statvfs(folder)
        free = (stats.f_bfree if os.geteuid() == 0 else stats.f_bavail) * stats.f_frsize  # root may use the reserve
        if free < NEARLY_FULL_BYTES:
            return errno.ENOSPC
    if resource.getrlimit(resource.RLIMIT_FSIZE)[0] != resource.RLIM_INFINITY:
        return errno.EFBIG
    return None

