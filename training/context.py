"""What a training run's parts read, assembled once: RunSpec (what train.py resolved) and RunContext (the spec
plus this process's place in the job, the built model/loss/optimizers, the data, the state), handed whole to
the TrainStep, the Checkpointer, the Logger, the Validator, the time budget and the header instead of six to nine
arguments each; each part reads the state from it, so no call passes it again."""
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from training.build import Parts, epoch_tokens
from training.checkpoint.init_from import InitFrom
from training.checkpoint.resume import Resume
from training.checkpoint.run_state import RunState
from training.config import TrainConfig
from training.runtime.distributed import DistInfo


@dataclass
class RunSpec:
    """What train.py resolved: the typed config, where the run lives, and where it resumes or starts from."""
    cfg: TrainConfig
    run_dir: Path
    config_yaml: str  # the resolved config, saved next to every checkpoint
    resume: Optional[Resume] = None  # the checkpoint it continues from, opened and checked
    multirun: bool = False  # one job of a `-m` sweep
    init: Optional[InitFrom] = None  # a new run's starting weights (init_from=), opened and checked


@dataclass
class RunContext:
    run: RunSpec
    info: DistInfo
    parts: Parts
    data: object  # data.PreparedData: meta, tokenizer, the token files
    batches: object  # the training batches (data/loader.py): a pure function of (seed, step, micro-batch, rank)
    windows: object  # this rank's validation windows
    state: RunState  # where the run stands; the parts read it, the loop advances it
    tokens_per_step: int  # over every micro-batch and rank
    peak: float  # the MFU peak, FLOP/s per device
    peak_source: str  # how the peak was obtained

    @property
    def cfg(self) -> TrainConfig:
        return self.run.cfg

    @property
    def epoch_tokens(self) -> int:
        """The tokens one epoch trains on (training/build.py's epoch_tokens): what the logged epochs count."""
        return epoch_tokens(self.cfg, self.data.meta["train_tokens"])

    @property
    def flops_per_token(self) -> float:
        return self.parts.raw_model.flops_per_token(self.cfg.trainer.seq_len)
