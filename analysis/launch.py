"""Running cells: each cell becomes a generated Hydra config option (`+cell=<name>`, a file under the
protocol's configs/cell/), and a stage becomes ONE `python train.py -m` multirun over those options —
one interpreter for all its jobs, and any Hydra launcher (submitit/Slurm) runs it unchanged."""
import copy
import os
import re
import signal
import subprocess
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import yaml

from analysis.protocol import Cell

CELL_GROUP = "cell"
CALLBACK = "+hydra.callbacks.ablate_status._target_=scripts.ablate_callback.JobStatusFile"


def cell_config(cell: Cell, values: dict, min_lr_ratio: float, group: str, stage: str,
                resume: Optional[Path] = None) -> dict:
    """The cell's config, merged after every other group: the variant's and size's values, its
    LR (min_lr scaled along), seed, run name (= its directory) and wandb group and tags."""
    config = copy.deepcopy(values)
    config.setdefault("optim", {}).update(lr=cell.lr, min_lr=cell.lr * min_lr_ratio)
    config.update(seed=cell.seed, run_name=cell.run_name)
    config["logger"] = {**config.get("logger", {}), "group": group,
                        "tags": ["ablate", stage, f"variant={cell.variant}", f"size={cell.size}", f"lr={cell.lr:g}"]}
    if resume is not None:
        config["resume"] = str(resume)
    return config


def write_cells(config_dir: Path, configs: Dict[str, dict]) -> None:
    """{option: config} → config_dir/cell/<option>.yaml, each a global-package config."""
    group = config_dir / CELL_GROUP
    group.mkdir(parents=True, exist_ok=True)
    for option, config in configs.items():
        (group / f"{option}.yaml").write_text("# @package _global_\n" + yaml.safe_dump(config, sort_keys=False))


def sweep_command(python: str, train_py: Path, experiment: Optional[str], overrides: Sequence[str],
                  config_dir: Path, sweep_dir: Path, options: Sequence[str]) -> List[str]:
    """`train.py -m` over the cells. Each job's directory is sweep_dir/<run_name> (not Hydra's job
    number), so a cell keeps its directory however many cells a later resume runs."""
    return [python, str(train_py), "-m", *([f"experiment={experiment}"] if experiment else []), *overrides,
            f"hydra.sweep.dir={_quoted(sweep_dir.resolve())}", "hydra.sweep.subdir=${run_name}",
            f"hydra.searchpath=[{_quoted('file://' + str(config_dir.resolve()))}]", CALLBACK,
            f"+{CELL_GROUP}={','.join(options)}"]


def _quoted(value) -> str:
    """A path as a Hydra override value: quoted when it holds characters the grammar would parse."""
    text = str(value)
    return text if re.fullmatch(r"[A-Za-z0-9_./:-]+", text) else "'" + text.replace("'", "\\'") + "'"


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
