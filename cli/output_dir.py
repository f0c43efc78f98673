"""Hydra callback: before Hydra creates the run (or sweep) directory, check that it can — a read-only or
unwritable outputs_dir is one `error:` line and exit 1, not Hydra's traceback from its own mkdir.
Registered for every train.py run in configs/train.yaml (hydra.callbacks)."""
import shutil
import sys
import tempfile
from pathlib import Path

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from cli.entry import one_line


class OutputDirCheck(Callback):
    def on_run_start(self, config, **kwargs) -> None:
        check_writable(OmegaConf.select(config, "hydra.run.dir"), "the run directory")

    def on_multirun_start(self, config, **kwargs) -> None:
        check_writable(OmegaConf.select(config, "hydra.sweep.dir"), "the sweep directory")


def check_writable(directory: str, what: str) -> None:
    """Exit with one line unless a directory can be made where `directory` will be (tried for real, in
    its nearest existing ancestor: permission bits do not tell what root, ACLs or a read-only mount allow)."""
    target = Path(directory).absolute()
    ancestor = next(p for p in (target, *target.parents) if p.exists())
    try:
        shutil.rmtree(tempfile.mkdtemp(prefix=".minillama-write-check-", dir=ancestor))
    except OSError as e:
        cause = e.strerror.lower() if e.strerror else one_line(e)
        print(f"error: cannot create {what} {target}: {cause} in {ancestor}; set outputs_dir=… to a writable "
              "directory", file=sys.stderr)
        sys.exit(1)
