"""Hydra callbacks of train.py runs: OutputDirCheck (every run, configs/train.yaml: an unwritable outputs_dir
is one `error:` line before Hydra tries to create the run directory) and JobStatusFile (the ablation
protocol's sweeps, studies/ablation/configs.py: each job's status for the protocol to read)."""

import shutil
import sys
import tempfile
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from cli import one_line
from training.checkpoint import RunFiles


class JobStatusFile(Callback):
    """At the end of every train.py job, job_status.yaml in its run directory — completed or failed, with the
    error — so the protocol can tell a diverged cell (recorded, never re-run) from a crash (retried).
    Registered per sweep: `+hydra.callbacks.ablate_status._target_=cli.callbacks.JobStatusFile`."""

    def on_job_end(self, config, job_return, **kwargs) -> None:
        run_dir = Path(job_return.hydra_cfg.hydra.runtime.output_dir)
        status = {"status": job_return.status.name}
        if status["status"] == "FAILED":
            error = job_return._return_value  # the exception; .return_value would re-raise it
            status["error"] = one_line(error)
            status["error_types"] = _chain(error)
        run_dir.mkdir(parents=True, exist_ok=True)  # train.py removes the directory of a failed start
        RunFiles(run_dir).write_job_status(status)


def _chain(error: BaseException) -> list:
    """Class names along the exception's cause/context chain: train.py re-raises a NonFiniteLoss
    as Hydra's one-line JobFailed, and the original stays reachable as its context."""
    names, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names.append(type(error).__name__)
        error = error.__cause__ or error.__context__
    return names


class OutputDirCheck(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        check_writable(_resolved(config, "hydra.run.dir"), "the run directory")

    def on_multirun_start(self, config, **kwargs) -> None:
        check_writable(_resolved(config, "hydra.sweep.dir"), "the sweep directory")


def _resolved(config, key: str) -> str:
    """The directory as Hydra will resolve it. The default run_name reads `${hydra:runtime.choices…}`, which
    resolves only once HydraConfig is set — Hydra sets it just after the run-start callbacks, to this same
    config, so setting it here first changes nothing but lets the check see the real path."""
    from hydra.core.hydra_config import HydraConfig

    HydraConfig.instance().set_config(config)
    return OmegaConf.select(config, key)


def check_writable(directory: str, what: str) -> None:
    """Exit with one line unless a directory can be made where `directory` will be (tried for real, in
    its nearest existing ancestor: permission bits do not tell what root, ACLs or a read-only mount allow)."""
    target = Path(directory).absolute()
    ancestor = next(p for p in (target, *target.parents) if p.exists())
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".minillama-write-check-", dir=ancestor))
    except OSError as e:
        cause = e.strerror.lower() if e.strerror else one_line(e)
        print(
            f"error: cannot create {what} {target}: {cause} in {ancestor}; set outputs_dir=… to a writable directory",
            file=sys.stderr,
        )
        sys.exit(1)
