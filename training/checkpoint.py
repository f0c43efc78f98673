"""Checkpoint directories: save atomically, find the latest, load for resume or for inference.

Layout of `<run_dir>/checkpoints/step_0000100/`:
  model.safetensors   unwrapped weights (no `_orig_mod.`/`module.` prefixes; tied head stored once)
  model_config.json   the ModelConfig fields — enough to rebuild the model
  tokenizer.json      the tokenizer the model was trained with
  config.yaml         the full resolved training config
  optimizer.pt        optimizer state (tensors and plain values: loads with weights_only=True)
  rng.pt              torch RNG states, as tensors
  state.json          step, tokens seen, data position, elapsed time
Nothing here is unpickled as arbitrary objects: safetensors, JSON and `torch.load(weights_only=True)`.
"""
import dataclasses
import json
import os
import shutil
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from safetensors.torch import load_file, save_file

from model import ModelConfig, Transformer

REQUIRED_FILES = ("model.safetensors", "model_config.json", "tokenizer.json", "state.json")
TIED_KEY = "lm_head.weight"


class CheckpointError(ValueError):
    """A checkpoint path that is missing, incomplete, corrupt or does not fit the model."""


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def save_checkpoint(ckpt_root: Path, step: int, model_state: Dict[str, torch.Tensor], model_cfg: ModelConfig,
                    tokenizer_path: Path, state: dict, config_yaml: str = "",
                    optimizer_state: Optional[dict] = None, keep_last: int = 3) -> Path:
    """Write everything to `step_N.tmp`, then rename: a crash mid-save never damages older checkpoints."""
    final = Path(ckpt_root) / checkpoint_name(step)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    weights = {k: v.detach().contiguous().cpu() for k, v in model_state.items()}
    if model_cfg.tie_embeddings:
        weights.pop(TIED_KEY, None)  # same storage as the embedding; safetensors refuses shared tensors
    save_file(weights, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "model_config.json").write_text(json.dumps(dataclasses.asdict(model_cfg), indent=2))
    shutil.copyfile(tokenizer_path, tmp / "tokenizer.json")
    (tmp / "config.yaml").write_text(config_yaml)
    if optimizer_state is not None:
        torch.save(optimizer_state, tmp / "optimizer.pt")
    torch.save(_rng_state(), tmp / "rng.pt")
    (tmp / "state.json").write_text(json.dumps(state, indent=2))
    if final.exists():  # re-saving the same step (e.g. SIGTERM right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    _prune(Path(ckpt_root), keep_last)
    return final


def _prune(ckpt_root: Path, keep_last: int) -> None:
    if keep_last <= 0:
        return
    for old in list_checkpoints(ckpt_root)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def list_checkpoints(ckpt_root: Path) -> list:
    """Complete checkpoints under ckpt_root, oldest first (half-written `.tmp` dirs are ignored)."""
    if not Path(ckpt_root).is_dir():
        return []
    found = [p for p in Path(ckpt_root).iterdir()
             if p.is_dir() and p.name.startswith("step_") and not p.name.endswith(".tmp")
             and (p / "state.json").exists()]
    return sorted(found, key=lambda p: p.name)


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
        return ModelConfig(**fields)
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/model_config.json is unreadable or invalid ({e}); the checkpoint is damaged")


def read_weights(model: torch.nn.Module, ckpt: Path) -> Dict[str, torch.Tensor]:
    """model.safetensors as a full state dict for `model`, every key and shape checked."""
    try:
        weights = load_file(str(Path(ckpt) / "model.safetensors"))
    except Exception as e:  # safetensors raises its own error types for truncated/corrupt files
        raise CheckpointError(f"{ckpt}/model.safetensors is corrupt or unreadable ({e}); use another checkpoint")
    expected = model.state_dict()
    if getattr(getattr(model, "cfg", None), "tie_embeddings", False):
        expected.pop(TIED_KEY, None)
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


def load_weights(model: torch.nn.Module, ckpt: Path) -> None:
    """Load model.safetensors into an unwrapped model."""
    model.load_state_dict(read_weights(model, ckpt))


def load_model(path: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
               ) -> Tuple[Transformer, "object", Path]:
    """Rebuild a Transformer + tokenizer from a checkpoint (dir, run dir or `latest`), for inference."""
    from tokenizers import Tokenizer  # imported here so checkpoint saving does not need it

    ckpt = resolve_checkpoint(path)
    cfg = load_model_config(ckpt)
    try:
        tokenizer = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    except Exception as e:
        raise CheckpointError(f"{ckpt}/tokenizer.json is unreadable ({e})")
    if tokenizer.get_vocab_size() != cfg.vocab_size:
        raise CheckpointError(f"{ckpt}: tokenizer has {tokenizer.get_vocab_size()} tokens but the model "
                              f"config says vocab_size={cfg.vocab_size}; the files come from different runs")
    model = Transformer(cfg)
    load_weights(model, ckpt)
    return model.to(device=device, dtype=dtype).eval(), tokenizer, ckpt


def _rng_state() -> dict:
    state = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def load_training_state(ckpt: Path) -> Tuple[dict, Optional[dict], dict]:
    """(state.json, optimizer state or None, rng states) — all without unpickling objects."""
    try:
        state = json.loads((ckpt / "state.json").read_text())
        opt_path = ckpt / "optimizer.pt"
        opt = torch.load(opt_path, map_location="cpu", weights_only=True) if opt_path.exists() else None
        rng = torch.load(ckpt / "rng.pt", map_location="cpu", weights_only=True)
    except Exception as e:
        raise CheckpointError(f"{ckpt} training state is unreadable ({e}); resume from an older checkpoint")
    return state, opt, rng


def restore_rng(rng: dict) -> None:
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
