"""How the sweep driver runs train.py: Jobs (generated Hydra options `+job=<name>`) as one multirun or one process each,
Ctrl-C passed on exactly once; each job's outcome read back from job_status.yaml (JobStatusFile writes it)."""

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import yaml
from hydra.experimental.callback import Callback

from lab import CONFIGS
from training import one_line
from training.checkpoint import RunFiles

TRAIN_PY = Path(__file__).resolve().parents[1] / "train.py"
JOB_GROUP = "job"
# Writes job_status.yaml into every job's run directory: completed, or failed with the error and its types.
CALLBACK = "+hydra.callbacks.job_status._target_=lab.launcher.JobStatusFile"
COMPLETED, FAILED, NOT_RUN = "COMPLETED", "FAILED", "NOT_RUN"


class JobStatusFile(Callback):
    """job_status.yaml in every job's run directory at its end (completed, or failed with the error): the sweep
    driver tells a diverged run (recorded, never re-run) from a crash (retried) by it. Registered by CALLBACK."""

    def on_job_end(self, config, job_return, **kwargs) -> None:
        run_dir = Path(job_return.hydra_cfg.hydra.runtime.output_dir)
        status = {"status": job_return.status.name}
        if status["status"] == "FAILED":
            error = job_return._return_value  # the exception; .return_value would re-raise it
            status["error"] = one_line(error)
            status["error_types"] = _chain(error)
        run_dir.mkdir(parents=True, exist_ok=True)  # train.py removes the directory of a failed start
        write_job_status(run_dir, status)


def write_job_status(run_dir: Path, status: dict) -> None:
    RunFiles(run_dir).job_status.write_text(yaml.safe_dump(status, sort_keys=False))


def read_job_status(run_dir: Path) -> Optional[dict]:
    """job_status.yaml (JobStatusFile writes it), or None where the job never finished."""
    try:
        status = yaml.safe_load(RunFiles(run_dir).job_status.read_text())
    except (OSError, yaml.YAMLError):
        return None
    return status if isinstance(status, dict) else None


def _chain(error: BaseException) -> list:
    """Class names along the exception's cause/context chain: train.py re-raises a NonFiniteLoss
    as Hydra's one-line JobFailed, and the original stays reachable as its context."""
    names, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names.append(type(error).__name__)
        error = error.__cause__ or error.__context__
    return names


def quoted(value) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar would parse."""
    text = str(value)
    return text if re.fullmatch(r"[A-Za-z0-9_./:-]+", text) else "'" + text.replace("'", "\\'") + "'"


@dataclass(frozen=True)
class Job:
    """One train.py run: where it writes, its group choices ({"optim": "muon"}) and values ({"seed": 1}), merged
    after every other config but the launcher's overrides; its output goes to <run_dir>.log beside it."""

    run_dir: Path
    values: dict = field(default_factory=dict)
    choices: Dict[str, str] = field(default_factory=dict)
    name: Optional[str] = None  # the option's name; default the run directory's

    @property
    def option(self) -> str:
        return self.name or self.run_dir.name

    @property
    def log_path(self) -> Path:
        return self.run_dir.parent / f"{self.run_dir.name}.log"


@dataclass(frozen=True)
class Ended:
    """How a job ended: COMPLETED, FAILED (with train.py's one-line error and the exception types along
    its chain) or NOT_RUN (stopped before it started, or its process died without a word)."""

    job: Job
    status: str
    error: Optional[str] = None
    error_types: Tuple[str, ...] = ()
    exit_code: int = 0  # its process's: 128 + N when signal N stopped it
    wall_s: Optional[float] = None  # its process's wall time, when it ran alone in one


def write_option(directory: Path, job: Job) -> None:
    """The job as a global-package option of group `job`: its choices as defaults-list overrides."""
    text = {
        **({"defaults": [*({f"override /{g}": c} for g, c in job.choices.items()), "_self_"]} if job.choices else {}),
        **job.values,
    }
    path = directory / JOB_GROUP / f"{job.option}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# @package _global_\n" + yaml.safe_dump(text, sort_keys=False))


class Launcher:
    """Runs lists of jobs. one_process: every list is one multirun (one process here, or the cluster's
    `cluster` launcher overrides, e.g. hydra/launcher=submitit_slurm); else each job its own process,
    `workers` at a time."""

    def __init__(
        self,
        options_dir: Path,
        overrides: Sequence[str] = (),
        workers: int = 1,
        one_process: bool = False,
        cluster: Sequence[str] = (),
        python: str = sys.executable,
    ):
        if workers < 1:
            raise ValueError(f"workers={workers}: run at least one job at a time")
        self.options_dir, self.overrides = options_dir, list(overrides)
        self.cluster, self.python = list(cluster), python
        self.workers, self.one_process = workers, one_process
        self._forwarder, self.exit_code = _Forwarder(), 0  # the last run()'s signal and worst exit status

    def command(self, jobs: Sequence[Job], root: Path) -> List[str]:
        """`train.py -m` over the jobs, each in its run directory under root (the sweep directory)."""
        subdir = "${run_name}" if len(jobs) > 1 else quoted(_relative(jobs[0], root))
        return [
            self.python,
            str(TRAIN_PY),
            "-m",
            *self.overrides,
            *self.cluster,
            f"hydra.sweep.dir={quoted(root.resolve())}",
            f"hydra.sweep.subdir={subdir}",
            f"hydra.searchpath=[{quoted('file://' + str(self.options_dir.resolve()))},{quoted('file://' + str(CONFIGS))}]",
            CALLBACK,
            f"+{JOB_GROUP}={','.join(j.option for j in jobs)}",
        ]

    @property
    def stopped(self) -> Optional[int]:
        """The signal that stopped the last run(), if one did."""
        return self._forwarder.signum

    @property
    def status(self) -> int:
        """The last run()'s exit status: its processes' worst, or 128 + the signal that stopped it (even one
        that landed between two jobs of a multirun, where Hydra exits 1)."""
        return 128 + self.stopped if self.stopped and self.exit_code < 128 else self.exit_code

    def run(self, jobs: Sequence[Job], root: Optional[Path] = None) -> Iterator[Ended]:
        """Each job's outcome as its process ends; after a Ctrl-C or SIGTERM no new one starts, the rest are NOT_RUN.
        root: the directory every run directory is under (default: their common parent)."""
        if not jobs:
            return
        if len({j.option for j in jobs}) != len(jobs):
            raise ValueError("two jobs share a name; give each its own")
        root = root or Path(os.path.commonpath([j.run_dir.resolve().parent for j in jobs]))
        together = self.one_process and len(jobs) > 1
        for job in jobs:
            if together:  # a multirun names each job's directory by its run_name (hydra.sweep.subdir)
                if job.values.get("run_name", _relative(job, root)) != _relative(job, root):
                    raise ValueError(f"{job.option}: in one multirun, run_name must be its directory under {root}")
                job = replace(job, values={**job.values, "run_name": _relative(job, root)})
            write_option(self.options_dir, job)
        batches = [list(jobs)] if self.one_process else [[j] for j in jobs]
        self._forwarder, self.exit_code = _Forwarder(), 0
        with self._forwarder:
            yield from self._run_batches(batches, root)

    def _run_batches(self, batches: List[List[Job]], root: Path) -> Iterator[Ended]:
        running = []  # (process, its jobs, start time, its log)
        try:
            while batches or running:
                while batches and len(running) < self.workers and self.stopped is None:
                    running.append(self._start(batches.pop(0), root))
                if not running:  # stopped: the batches left never start
                    yield from (Ended(j, NOT_RUN, exit_code=128 + self.stopped) for batch in batches for j in batch)
                    return
                time.sleep(0.05)
                for entry in [e for e in running if e[0].poll() is not None]:
                    running.remove(entry)
                    yield from self._finish(*entry)
        finally:  # a caller that stops reading: its processes still end before it goes on
            for proc, *_ in running:
                proc.wait()

    def _start(self, batch: List[Job], root: Path):
        # A process of one job logs into the job's log; a multirun of several writes where this process does.
        if not self.one_process:
            batch[0].log_path.parent.mkdir(parents=True, exist_ok=True)
        log = None if self.one_process else open(batch[0].log_path, "w")
        cmd = self.command(batch, root)
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT if log else None, start_new_session=True)
        self._forwarder.processes.append(proc)
        return proc, batch, time.time(), log

    def _finish(self, proc, batch, start, log) -> Iterator[Ended]:
        code = 128 - proc.returncode if proc.returncode < 0 else proc.returncode  # killed by N: 128 + N
        if log is not None:
            log.close()
        self.exit_code = max(self.exit_code, code)
        wall = time.time() - start if len(batch) == 1 else None
        yield from (_ended(j, code, wall) for j in batch)


def _relative(job: Job, root: Path) -> str:
    return job.run_dir.resolve().relative_to(root.resolve()).as_posix()


def _ended(job: Job, code: int, wall: Optional[float]) -> Ended:
    status = read_job_status(job.run_dir)
    if status is None:
        return Ended(job, NOT_RUN, exit_code=code, wall_s=wall)
    return Ended(job, status["status"], status.get("error"), tuple(status.get("error_types", ())), code, wall)


class _Forwarder:
    """A Ctrl-C or SIGTERM passed on exactly once to each job's own session, where train.py checkpoints and ends
    (a terminal's Ctrl-C would otherwise reach both processes, and a second signal means 'stop without saving')."""

    def __init__(self):
        self.processes: List[subprocess.Popen] = []
        self.signum: Optional[int] = None

    def forward(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum
        for proc in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signum)

    def __enter__(self):
        self.previous = {s: signal.signal(s, self.forward) for s in (signal.SIGINT, signal.SIGTERM)}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)
