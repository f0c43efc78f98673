"""Starting a new run from a checkpoint's weights (`init_from=`): fine-tuning, or a pretrained run continued
on other text.

Unlike a resume (checkpoint/resume.py), which continues the same run — its step, schedule, optimizer state,
RNG, data order and run directory — a run started from weights is a new run: step 0, its own data, optimizer,
schedule and run directory. It takes from the checkpoint only what the weights need: the architecture
(model_config.json; model.* overrides may change only what shapes no weight) and the tokenizer (the data is
read with it). The checkpoint is verified and checked like any other before anything trusts it. A Hugging Face
directory is converted to a checkpoint at the edge first (cli/config.py, interop/hf_import.py).
"""
import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from data.tokenizer import SPECIAL_TOKENS_FILE, file_hash
from model import ModelConfig
from training.checkpoint.consistency import RESUMABLE_CHANGES, architecture_changes, open_checkpoint, same_json
from training.checkpoint.errors import CheckpointError
from training.checkpoint.format import TOKENIZER, checkpoint_step
from training.checkpoint.load import read_weights


@dataclass(frozen=True)
class InitFrom:
    """A verified, self-consistent checkpoint whose weights a new run starts from."""
    path: Path
    model: ModelConfig  # the architecture the new run builds
    source: str  # what the user named: a path, `latest`, `best`, or a Hugging Face directory

    @classmethod
    def open(cls, path: str, outputs_dir: str = "outputs", verify: bool = True, source: Optional[str] = None,
             warn: Callable[[str], None] = lambda message: None) -> "InitFrom":
        if not Path(path).exists() and path not in ("latest", "best"):
            raise CheckpointError(f"init_from={path} does not exist; pass a checkpoint directory, a run directory, "
                                  "'latest', 'best' or a Hugging Face Llama directory")
        return cls(*open_checkpoint(path, outputs_dir, verify, warn), source or path)

    def describe(self) -> str:
        """For the header: where the weights come from."""
        step = checkpoint_step(self.path)
        where = f"{self.source} → {self.path}" if self.source != str(self.path) else str(self.path)
        return f"weights: from {where}" + (f" (its step {step})" if step else "") + "; a new run from step 0"

    def check_fits(self, run_model: ModelConfig) -> None:
        """The run builds the checkpoint's architecture: model.* may change only what shapes no weight."""
        changed = architecture_changes(run_model, self.model)
        if changed:
            raise CheckpointError(f"cannot start from {self.path} with {', '.join(changed)}: init_from keeps the "
                                  "checkpoint's architecture (its weights fit no other); drop those model.* overrides, "
                                  f"or train from scratch without init_from (model.* may change {', '.join(RESUMABLE_CHANGES)})")

    def check_tokenizer(self, tokenizer_path: str) -> None:
        """A data.tokenizer_path the user set must be the checkpoint's: its token ids are the embedding's rows."""
        if not same_json(Path(tokenizer_path), self.path / TOKENIZER):
            raise CheckpointError(f"data.tokenizer_path={tokenizer_path} is not the tokenizer of {self.path}: the "
                                  "weights read token ids of their own tokenizer, which init_from carries over; drop "
                                  "data.tokenizer_path (or train from scratch to use another tokenizer)")

    def carry_tokenizer(self, cache_dir: str) -> Path:
        """The checkpoint's tokenizer (with its special_tokens.json), copied to `<cache_dir>/tokenizers/<hash>/`:
        the new run's data is read with it, and the copy outlives the checkpoint (keep_last may prune it, a
        staged Hugging Face import is temporary). Returns the copy's tokenizer.json."""
        source, special = self.path / TOKENIZER, self.path / SPECIAL_TOKENS_FILE
        key = hashlib.sha256((file_hash(source) + (file_hash(special) if special.is_file() else "")).encode())
        folder = Path(cache_dir) / "tokenizers" / key.hexdigest()[:16]
        target = folder / TOKENIZER
        if not target.is_file():
            tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")  # every torchrun rank carries it
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            shutil.copyfile(source, tmp / TOKENIZER)
            if special.is_file():
                shutil.copyfile(special, tmp / SPECIAL_TOKENS_FILE)
            try:
                tmp.rename(folder)
            except OSError:  # another process carried the same tokenizer meanwhile: theirs is the same bytes
                shutil.rmtree(tmp, ignore_errors=True)
        return target

    def load(self, raw_model: torch.nn.Module) -> None:
        """The checkpoint's weights into the freshly built, not yet wrapped model (every key and shape checked)."""
        raw_model.load_state_dict(read_weights(raw_model, self.path))
