"""Hydra callback of scripts/ablate.py: at the end of every train.py job, write job_status.yaml into
its run directory — completed or failed, with the error — so the protocol can tell a diverged cell
(recorded, never re-run) from a crash (retried). Registered per sweep by the protocol
(analysis/ablation/configs.py): `+hydra.callbacks.ablate_status._target_=cli.job_status.JobStatusFile`."""
from pathlib import Path

import yaml
from hydra.experimental.callback import Callback

from analysis.ablation.cells import STATUS_FILE
from cli.entry import one_line


class JobStatusFile(Callback):
    def on_job_end(self, config, job_return, **kwargs) -> None:
        run_dir = Path(job_return.hydra_cfg.hydra.runtime.output_dir)
        status = {"status": job_return.status.name}
        if status["status"] == "FAILED":
            error = job_return._return_value  # the exception; .return_value would re-raise it
            status["error"] = one_line(error)
            status["error_types"] = _chain(error)
        run_dir.mkdir(parents=True, exist_ok=True)  # train.py removes the directory of a failed start
        (run_dir / STATUS_FILE).write_text(yaml.safe_dump(status, sort_keys=False))


def _chain(error: BaseException) -> list:
    """Class names along the exception's cause/context chain: train.py re-raises a NonFiniteLoss
    as Hydra's one-line JobFailed, and the original stays reachable as its context."""
    names, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        names.append(type(error).__name__)
        error = error.__cause__ or error.__context__
    return names
