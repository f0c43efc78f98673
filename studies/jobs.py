"""Running train.py for a study — the one launcher of the ablation protocol and the speedrun: Hydra
arguments quoted, one job with its log, a multirun that a Ctrl-C stops exactly once, a failed or
cut-off run moved aside (never deleted), and the CPU lock that keeps other jobs off a timed run."""
import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Optional, Sequence

TRAIN_PY = Path(__file__).resolve().parents[1] / "train.py"


def quoted(value) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar would parse."""
    text = str(value)
    return text if re.fullmatch(r"[A-Za-z0-9_./:-]+", text) else "'" + text.replace("'", "\\'") + "'"


def run_job(command: Sequence[str], log_path: Path, env: Optional[dict] = None) -> int:
    """Run one train.py job to its end, stdout and stderr into log_path; its exit status."""
    with open(log_path, "w") as log:
        proc = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
        try:
            return proc.wait()
        except KeyboardInterrupt:  # the terminal's Ctrl-C reached train.py too: let it save and stop
            proc.wait()
            raise


def run_sweep(command: Sequence[str], cwd: Path, env: Optional[dict] = None) -> int:
    """Run the multirun to its end and return its exit status (128 + signal when stopped).

    The sweep gets its own session, and a Ctrl-C or SIGTERM that reaches this process is passed on
    exactly once: train.py then checkpoints the job it is in and ends the sweep. (A terminal's
    Ctrl-C would otherwise reach both processes, and a second signal means 'stop without saving'.)
    """
    proc = subprocess.Popen(list(command), cwd=cwd, env={**os.environ, **(env or {})}, start_new_session=True)
    forwarded = []

    def forward(signum, frame):
        forwarded.append(signum)
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        code = proc.wait()
        code = 128 - code if code < 0 else code  # killed by signal N: report it as a shell would, 128 + N
        # Stopped on request even if the signal landed between two jobs, where Hydra exits 1.
        return 128 + forwarded[0] if forwarded and code < 128 else code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def move_aside(path: Path, discarded_dir: Path, name) -> Path:
    """Keep a failed or cut-off run out of the way (never delete it) before it runs again:
    discarded_dir/<time>/<name>, with -1, -2, … when that exists already."""
    target = discarded_dir / time.strftime("%Y-%m-%d_%H-%M-%S") / name
    n = 1
    while target.exists():
        target = target.with_name(f"{target.name}-{n}")
        n += 1
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(path), str(target))
    return target


@contextlib.contextmanager
def cpu_lock(path: Optional[Path]):
    """Hold an exclusive flock on `path` (the same lock as `flock FILE command`), or nothing without one."""
    if path is None:
        yield
        return
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for the lock {path} (another job is using the machine)", flush=True)
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file releases it
