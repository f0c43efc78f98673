"""Saving a checkpoint directory atomically: everything into `step_N.tmp`, then one rename.

NaN/inf weights are never saved, and a refused write (full disk, ulimit -f, permissions) is one
CheckpointWriteError naming the file, the cause and the fix (write_errors.py). The files are
those format.py lists.
"""
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional

import torch
from safetensors import SafetensorError
from safetensors.torch import save_file

from data.tokenizer import SPECIAL_TOKENS_FILE
from model import ModelConfig
from training.checkpoint.errors import CheckpointError, CheckpointWriteError, NonFiniteCheckpoint
from training.checkpoint.format import (CONFIG, MODEL_CONFIG, OPTIMIZER, RNG, STATE, TIED_KEY, TOKENIZER, WEIGHTS,
                                        checkpoint_name, last_good_checkpoint, list_checkpoints, nonfinite_tensors,
                                        run_checkpoints)
from training.checkpoint.manifest import MANIFEST, write_manifest
from training.checkpoint.write_errors import ErrnoRecordingFile, is_write_failure, write_error_cause
from training.checkpoint.run_state import write_state


def save_checkpoint(ckpt_root: Path, step: int, model_state: Dict[str, torch.Tensor], model_cfg: ModelConfig,
                    tokenizer_path: Path, state: dict, config_yaml: str = "",  # state: RunState.to_json()
                    optimizer_state: Optional[dict] = None, keep_last: int = 3,
                    rng_state: Optional[dict] = None) -> Path:
    """Write everything to `step_N.tmp`, manifest.json last, then rename: a crash mid-save never damages
    older checkpoints, and a checkpoint is complete once its name has no `.tmp`.

    `rng_state`: every rank's generator states (`gather_rng_states`); by default this process's.

    Raises NonFiniteCheckpoint (nothing written) for NaN/inf weights or optimizer state, and
    CheckpointWriteError (the `.tmp` removed, nothing pruned) when the disk refuses a write.
    """
    ckpt_root = Path(ckpt_root)
    final = ckpt_root / checkpoint_name(step)
    tmp = final.with_name(final.name + ".tmp")
    weights = {k: v.detach().contiguous().cpu() for k, v in model_state.items()}
    if model_cfg.tie_embeddings:
        weights.pop(TIED_KEY, None)  # same storage as the embedding; safetensors refuses shared tensors
    _refuse_nonfinite(step, ckpt_root, weights, optimizer_state)
    if not Path(tokenizer_path).is_file():
        raise CheckpointError(f"cannot save step {step}: the tokenizer {tokenizer_path} is missing")
    special = Path(tokenizer_path).parent / SPECIAL_TOKENS_FILE
    writers = [
        (WEIGHTS, lambda p: save_weights(weights, p)),
        (MODEL_CONFIG, lambda p: p.write_text(json.dumps(dataclasses.asdict(model_cfg), indent=2))),
        (TOKENIZER, lambda p: shutil.copyfile(tokenizer_path, p)),
        # An imported tokenizer's own BOS/EOS/PAD travel with it into every later checkpoint.
        *([(SPECIAL_TOKENS_FILE, lambda p: shutil.copyfile(special, p))] if special.is_file() else []),
        (CONFIG, lambda p: p.write_text(config_yaml)),
        *([(OPTIMIZER, lambda p: _torch_save(optimizer_state, p))] if optimizer_state is not None else []),
        (RNG, lambda p: _torch_save(rng_state or rng_states_of_this_process(), p)),
        (STATE, lambda p: write_state(p, state)),
        # Last: the size and SHA-256 of every file above, checked whenever the checkpoint is loaded.
        (MANIFEST, lambda p: write_manifest(p.parent)),
    ]
    target = tmp
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for name, write in writers:
            target = tmp / name
            write(target)
        target = final
        _publish(tmp, final)
    except (OSError, RuntimeError, SafetensorError) as e:
        cause = write_error_cause(e, target, ckpt_root) if is_write_failure(e) else None  # before freeing space
        shutil.rmtree(tmp, ignore_errors=True)
        if cause is None:
            raise  # not the environment refusing a write: a bug, keep the traceback
        previous = run_checkpoints(ckpt_root)
        kept = f"the last checkpoint, {previous[-1]}, is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointWriteError(f"cannot save checkpoint {final.name}: {cause}; {kept}") from e
    _prune(ckpt_root, keep_last)
    return final


def _torch_save(obj, path: Path) -> None:
    """torch.save through a file object that keeps the errno torch's own message drops."""
    with open(path, "wb") as file:
        recorder = ErrnoRecordingFile(file)
        try:
            torch.save(obj, recorder)
        except RuntimeError as e:
            if recorder.error is not None:
                raise recorder.error from e
            raise


def save_weights(tensors: dict, path: Path) -> None:
    """safetensors weights, with the permissions of any other file this process writes: safetensors creates
    them 0600 (a private temporary file, renamed), which made an export meant for sharing unreadable to others."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def _publish(tmp: Path, final: Path) -> None:
    """Rename `tmp` to `final`. Re-saving a step moves the old copy aside first and deletes it only
    after the rename, so some complete copy exists at every moment (see clean_partial_checkpoints)."""
    if not final.exists():
        os.replace(tmp, final)
        return
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    os.replace(final, old)
    try:
        os.replace(tmp, final)
    except OSError:
        os.replace(old, final)  # put the old copy back: the caller reports the failure
        raise
    shutil.rmtree(old, ignore_errors=True)


def _refuse_nonfinite(step: int, ckpt_root: Path, weights: Dict[str, torch.Tensor], optimizer_state) -> None:
    bad = nonfinite_tensors(weights)
    bad_optimizer = nonfinite_tensors(optimizer_state, "optimizer") if optimizer_state is not None else []
    if not bad and not bad_optimizer:
        return
    last = last_good_checkpoint(ckpt_root)
    what = f"{len(bad)} of {len(weights)} weight tensors hold" if bad else "the optimizer state holds"
    raise NonFiniteCheckpoint(
        f"refusing to save step {step}: {what} NaN or inf (first: {(bad or bad_optimizer)[0]}); "
        + (f"the last good checkpoint is {last}" if last else "there is no earlier good checkpoint"), last)


def _prune(ckpt_root: Path, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints, and always the newest one whose weights are finite."""
    if keep_last <= 0:
        return
    good = last_good_checkpoint(ckpt_root)
    for old in list_checkpoints(ckpt_root)[:-keep_last]:
        if old != good:
            shutil.rmtree(old, ignore_errors=True)


def rng_states_of_this_process() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state
