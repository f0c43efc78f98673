"""Loading a checkpoint directory: weights for a model (every key and shape checked), a model for
inference, and the training state (counters, optimizer, RNG) for a resume — nothing unpickled as objects."""
import pickle
import re
import sys
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from safetensors.torch import load_file

from model import Transformer
from training.checkpoint.consistency import open_checkpoint
from training.checkpoint.run_state import read_state
from training.checkpoint.errors import CheckpointError, first_line
from training.checkpoint.format import OPTIMIZER, RNG, TIED_KEY, TOKENIZER, WEIGHTS, nonfinite_tensors


def read_weights(model: Transformer, ckpt: Path) -> Dict[str, torch.Tensor]:
    """model.safetensors as a full state dict for the (unwrapped) `model`, every key and shape checked."""
    try:
        weights = load_file(str(Path(ckpt) / WEIGHTS))
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
    bad = nonfinite_tensors(weights)
    if bad:  # never saved so: the file was damaged or written elsewhere; training or sampling from it is garbage
        raise CheckpointError(f"{ckpt}/model.safetensors holds NaN or inf in {bad[0]} ({len(bad)} of {len(weights)} "
                              "tensors); use another checkpoint (an earlier step, or checkpoints/best)")
    if TIED_KEY not in weights and TIED_KEY in model.state_dict():
        weights[TIED_KEY] = weights["embed_tokens.weight"]  # the tied head is the embedding
    return weights


def load_weights(model: Transformer, ckpt: Path) -> None:
    """Load model.safetensors into an unwrapped model."""
    model.load_state_dict(read_weights(model, ckpt))


def load_model(path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
               verify: bool = True) -> Tuple[Transformer, "object", Path]:
    """Rebuild a Transformer + tokenizer from a checkpoint (dir, run dir or `latest`), for inference: its
    files verified against manifest.json (unless `verify` is off), then checked against each other."""
    from tokenizers import Tokenizer  # imported here so checkpoint saving does not need it

    ckpt, cfg = open_checkpoint(path, verify=verify, warn=lambda message: print(message, file=sys.stderr))
    tokenizer = Tokenizer.from_file(str(ckpt / TOKENIZER))  # readable: checked above
    model = Transformer(cfg)
    load_weights(model, ckpt)
    return model.to(device=device, dtype=dtype).eval(), tokenizer, ckpt


def load_training_state(ckpt: Path) -> Tuple[dict, Optional[dict], dict]:
    """(state.json, optimizer state, rng states) — all without unpickling objects; each one required."""
    ckpt = Path(ckpt)
    try:
        state = read_state(ckpt)
    except (OSError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/state.json is unreadable ({first_line(e)}); resume from an older checkpoint")
    rng = _safe_torch_load(ckpt / RNG)
    return state, _safe_torch_load(ckpt / OPTIMIZER), rng


def load_optimizer_and_rng(ckpt: Path) -> Tuple[dict, dict]:
    """(optimizer state, rng states), both required: a resume without its optimizer state would restart
    AdamW's moments and Muon's momentum silently."""
    rng = _safe_torch_load(Path(ckpt) / RNG)
    return _safe_torch_load(Path(ckpt) / OPTIMIZER), rng


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
        raise CheckpointError(f"{path} is truncated or corrupt ({first_line(e).split('. ')[0]}); "
                              "resume from an older checkpoint") from None


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
