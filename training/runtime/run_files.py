"""A run directory's files: the one module that names them, and a typed reader and writer for each.

    <run>/
      config.yaml                the resolved training config: train.py writes it first; resume and studies read it
      metrics.jsonl              a JSON row per log and evaluation (training/metrics.py owns what is in it)
      job_status.yaml            a sweep job's outcome: cli/callbacks.py writes it, the ablation reads it
      .owner                     the live process's claim (training/runtime/run_dir.py)
      checkpoints/step_N/        one checkpoint; what is inside is training/checkpoint/format.py's, and among it
      checkpoints/best/step_N/   state.json, the run's counters (training/checkpoint/run_state.py)

Every other module reaches these names through here, so a format change next month is one edit:
tests/test_run_files.py fails on any of them written as a literal anywhere else in the code.
"""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import yaml

CONFIG = "config.yaml"
METRICS = "metrics.jsonl"
JOB_STATUS = "job_status.yaml"
CLAIM = ".owner"
CHECKPOINTS = "checkpoints"
STATE = "state.json"  # in every checkpoint directory, written last: it marks the checkpoint complete

NAMES = (CONFIG, METRICS, JOB_STATUS, CLAIM, CHECKPOINTS, STATE)


@dataclass(frozen=True)
class RunFiles:
    """One run directory's files: their paths, and readers that return plain data."""
    root: Path

    def __post_init__(self):
        object.__setattr__(self, "root", Path(self.root))

    @property
    def config(self) -> Path:
        return self.root / CONFIG

    @property
    def metrics(self) -> Path:
        return self.root / METRICS

    @property
    def job_status(self) -> Path:
        return self.root / JOB_STATUS

    @property
    def claim(self) -> Path:
        return self.root / CLAIM

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS

    def holds_run(self) -> bool:
        """Whether a run wrote here: metrics or checkpoints (also a run from before claim files existed)."""
        return self.metrics.exists() or self.checkpoints.exists()

    def is_complete(self) -> bool:
        """A run's two files every study reads: its config and its metrics."""
        return self.config.is_file() and self.metrics.is_file()

    def read_config(self) -> dict:
        """config.yaml as plain data. Raises OSError for a missing file, yaml.YAMLError for a corrupt one."""
        return read_config(self.root)

    def write_config(self, text: str) -> None:
        self.config.write_text(text)

    def read_job_status(self) -> Optional[dict]:
        """job_status.yaml, or None where the job never finished (a kill) or left no readable status."""
        try:
            status = yaml.safe_load(self.job_status.read_text())
        except (OSError, yaml.YAMLError):
            return None
        return status if isinstance(status, dict) else None

    def write_job_status(self, status: dict) -> None:
        self.job_status.write_text(yaml.safe_dump(status, sort_keys=False))


def read_config(directory: Path) -> dict:
    """The config.yaml of a run or of a checkpoint (each holds the run's config under the same name)."""
    return yaml.safe_load((Path(directory) / CONFIG).read_text()) or {}
