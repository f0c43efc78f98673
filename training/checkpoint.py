"""Checkpoint directories: save atomically, find the latest, load for resume or for inference.

Layout of `<run_dir>/checkpoints/step_0000100/`:
  model.safetensors   unwrapped weights (no `_orig_mod.`/`module.` prefixes; tied head stored once)
  model_config.json   the ModelConfig fields — enough to rebuild the model
  tokenizer.json      the tokenizer the model was trained with
  config.yaml         the full resolved training config
  optimizer.pt        optimizer state (tensors and plain values: loads with weights_only=True)
  rng.pt              torch RNG states, as tensors
  state.json          step, tokens seen, data position, elapsed time, weights_finite (written last)
Nothing here is unpickled as arbitrary objects: safetensors, JSON and `torch.load(weights_only=True)`.
NaN/inf weights are never saved, and a refused write (full disk, ulimit -f, permissions) is one
CheckpointWriteError naming the file, the cause and the fix (training/write_errors.py).
"""
import dataclasses
import json
import os
import pickle
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from data.tokenizer import SPECIAL_TOKENS_FILE
from model import ModelConfig, Transformer
from training.write_errors import ErrnoRecordingFile, is_write_failure, write_error_cause

REQUIRED_FILES = ("model.safetensors", "model_config.json", "tokenizer.json", "state.json")
TIED_KEY = "lm_head.weight"
STEP_DIR = re.compile(r"step_(\d+)")


class CheckpointError(ValueError):
    """A checkpoint path that is missing, incomplete, corrupt or does not fit the model."""


class CheckpointWriteError(CheckpointError):
    """Writing a checkpoint failed (disk full, file-size limit, permissions): nothing was kept or pruned."""


class NonFiniteCheckpoint(CheckpointError):
    """The weights or optimizer state hold NaN/inf: nothing was written."""

    def __init__(self, message: str, last_good: Optional[Path]):
        super().__init__(message)
        self.last_good = last_good


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def checkpoint_step(path: Path) -> Optional[int]:
    """N for a `step_N` directory name, None for anything else (`.tmp`, `.old`, `best`, …)."""
    match = STEP_DIR.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def save_checkpoint(ckpt_root: Path, step: int, model_state: Dict[str, torch.Tensor], model_cfg: ModelConfig,
                    tokenizer_path: Path, state: dict, config_yaml: str = "",
                    optimizer_state: Optional[dict] = None, keep_last: int = 3,
                    rng_state: Optional[dict] = None) -> Path:
    """Write everything to `step_N.tmp`, then rename: a crash mid-save never damages older checkpoints.

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
        ("model.safetensors", lambda p: save_file(weights, str(p), metadata={"format": "pt"})),
        ("model_config.json", lambda p: p.write_text(json.dumps(dataclasses.asdict(model_cfg), indent=2))),
        ("tokenizer.json", lambda p: shutil.copyfile(tokenizer_path, p)),
        # An imported tokenizer's own BOS/EOS/PAD travel with it into every later checkpoint.
        *([(SPECIAL_TOKENS_FILE, lambda p: shutil.copyfile(special, p))] if special.is_file() else []),
        ("config.yaml", lambda p: p.write_text(config_yaml)),
        *([("optimizer.pt", lambda p: _torch_save(optimizer_state, p))] if optimizer_state is not None else []),
        ("rng.pt", lambda p: _torch_save(rng_state or rng_states_of_this_process(), p)),
        # Last, since list_checkpoints takes a directory with state.json as complete.
        ("state.json", lambda p: p.write_text(json.dumps({**state, "weights_finite": True}, indent=2))),
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
        previous = list_checkpoints(ckpt_root)
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


def nonfinite_tensors(tree, prefix: str = "") -> List[str]:
    """Names of the floating-point tensors in a (nested) state dict that hold NaN or inf."""
    if isinstance(tree, torch.Tensor):
        return [prefix] if tree.is_floating_point() and not bool(torch.isfinite(tree).all()) else []
    if isinstance(tree, dict):
        items = tree.items()
    elif isinstance(tree, (list, tuple)):
        items = enumerate(tree)
    else:
        return []
    return [name for key, value in items
            for name in nonfinite_tensors(value, f"{prefix}.{key}" if prefix else str(key))]


def _prune(ckpt_root: Path, keep_last: int) -> None:
    """Keep the newest `keep_last` checkpoints, and always the newest one whose weights are finite."""
    if keep_last <= 0:
        return
    good = last_good_checkpoint(ckpt_root)
    for old in list_checkpoints(ckpt_root)[:-keep_last]:
        if old != good:
            shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(ckpt_root: Path) -> list:
    """Complete checkpoints under ckpt_root, oldest first (half-written `.tmp` dirs are ignored)."""
    if not Path(ckpt_root).is_dir():
        return []
    found = [p for p in Path(ckpt_root).iterdir()
             if p.is_dir() and checkpoint_step(p) is not None and (p / "state.json").exists()]
    return sorted(found, key=checkpoint_step)  # by number: step_10000000 comes after step_9999999


def last_good_checkpoint(ckpt_root: Path) -> Optional[Path]:
    """The newest complete checkpoint whose weights are finite, or None."""
    for ckpt in reversed(list_checkpoints(ckpt_root)):
        if _weights_finite(ckpt):
            return ckpt
    return None


def _weights_finite(ckpt: Path) -> bool:
    try:
        flag = json.loads((ckpt / "state.json").read_text()).get("weights_finite")
        if flag is not None:
            return bool(flag)
        with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:  # written before the flag existed
            return all(not nonfinite_tensors(f.get_tensor(k)) for k in f.keys())
    except (OSError, ValueError, SafetensorError):  # unreadable: not a checkpoint to fall back on
        return False


def resolve_checkpoint(path: str, outputs_dir: str = "outputs") -> Path:
    """A checkpoint dir, a run dir (→ its newest checkpoint) or `latest` (→ newest in outputs_dir)."""
    if path == "latest":
        candidates = [c for run in Path(outputs_dir).glob("**/checkpoints") for c in list_checkpoints(run)]
        if not candidates:
            raise CheckpointError(f"'latest' found no checkpoint under {outputs_dir}/; "
                                  "train first or pass a checkpoint directory")
        return max(candidates, key=lambda p: (p / "state.json").stat().st_mtime)
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{path} does not exist; pass a checkpoint directory, a run directory or 'latest'")
    if (p / "checkpoints").is_dir():
        ckpts = list_checkpoints(p / "checkpoints")
        if not ckpts:
            raise CheckpointError(f"run directory {path} has no complete checkpoint")
        return ckpts[-1]
    if list_checkpoints(p):  # a directory of step_* checkpoints
        return list_checkpoints(p)[-1]
    missing = [f for f in REQUIRED_FILES if not (p / f).exists()]
    if missing:
        raise CheckpointError(f"{path} is not a minillama checkpoint (missing {', '.join(missing)}); "
                              "pass a directory like outputs/<run>/checkpoints/step_0001000")
    return p


def load_model_config(ckpt: Path) -> ModelConfig:
    try:
        fields = json.loads((Path(ckpt) / "model_config.json").read_text())
        return ModelConfig.from_dict(fields)
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/model_config.json is unreadable or invalid ({e}); the checkpoint is damaged")


def read_weights(model: Transformer, ckpt: Path) -> Dict[str, torch.Tensor]:
    """model.safetensors as a full state dict for the (unwrapped) `model`, every key and shape checked."""
    try:
        weights = load_file(str(Path(ckpt) / "model.safetensors"))
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise CheckpointError(f"{ckpt}/model.safetensors is corrupt or unreadable ({e}); use another checkpoint")
    expected = model.state_dict()
    if model.cfg.tie_embeddings:
        expected.pop(TIED_KEY)  # stored once, as the embedding
    missing, unexpected = sorted(set(expected) - set(weights)), sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise CheckpointError(f"{ckpt}/model.safetensors does not match the model config "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for k, v in weights.items():
        if v.shape != expected[k].shape:
            raise CheckpointError(f"{ckpt}: weight {k} has shape {tuple(v.shape)}, "
                                  f"model config expects {tuple(expected[k].shape)}")
    if TIED_KEY not in weights and TIED_KEY in model.state_dict():
        weights[TIED_KEY] = weights["embed_tokens.weight"]  # the tied head is the embedding
    return weights


def load_weights(model: Transformer, ckpt: Path) -> None:
    """Load model.safetensors into an unwrapped model."""
    model.load_state_dict(read_weights(model, ckpt))


def load_model(path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
               ) -> Tuple[Transformer, "object", Path]:
    """Rebuild a Transformer + tokenizer from a checkpoint (dir, run dir or `latest`), for inference."""
    from tokenizers import Tokenizer  # imported here so checkpoint saving does not need it

    from training.checkpoint_consistency import check_checkpoint_consistency  # it imports this module

    ckpt = resolve_checkpoint(path)
    cfg = check_checkpoint_consistency(ckpt)
    tokenizer = Tokenizer.from_file(str(ckpt / "tokenizer.json"))  # readable: checked above
    model = Transformer(cfg)
    load_weights(model, ckpt)
    return model.to(device=device, dtype=dtype).eval(), tokenizer, ckpt


def rng_states_of_this_process() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_training_state(ckpt: Path) -> Tuple[dict, Optional[dict], dict]:
    """(state.json, optimizer state or None, rng states) — all without unpickling objects."""
    ckpt = Path(ckpt)
    try:
        state = json.loads((ckpt / "state.json").read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/state.json is unreadable ({_first_line(e)}); resume from an older checkpoint")
    opt_path = ckpt / "optimizer.pt"
    opt = _safe_torch_load(opt_path) if opt_path.exists() else None
    return state, opt, _safe_torch_load(ckpt / "rng.pt")


def _safe_torch_load(path: Path):
    """torch.load(weights_only=True) with one-line errors. A refused pickle gets its own message:
    torch's suggests loading the file with the unsafe loader, the one thing not to do with it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        found = re.search(r"GLOBAL ([\w.]+)", str(e))
        what = f" ({found.group(1)})" if found else ""
        raise CheckpointError(f"{path} holds Python objects{what} that minillama never writes, so it was refused "
                              "unread: the file was tampered with or comes from elsewhere; do not use this "
                              "checkpoint, resume from another one") from None
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing; the checkpoint is incomplete, resume from another one") from None
    except Exception as e:  # torch raises RuntimeError/EOFError/… for truncated or corrupt archives
        raise CheckpointError(f"{path} is truncated or corrupt ({_first_line(e).split('. ')[0]}); "
                              "resume from an older checkpoint") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else type(error).__name__)[:200]


def restore_rng(rng: dict, rank: int = 0, world_size: int = 1) -> bool:
    """Restore this rank's generators; False when the checkpoint has no state for it (written by
    another world size, or before per-rank states were saved): the caller's seeding then stands."""
    ranks = rng.get("ranks")
    if ranks is not None and len(ranks) == world_size:
        rng = ranks[rank]
    elif rank != 0 or (ranks is not None and world_size != len(ranks)):
        return False
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return True
