"""The checkpoint directory's format: its files, names and errors, and finding checkpoints on disk.

Layout of `<run_dir>/checkpoints/step_0000100/`:
  model.safetensors   unwrapped weights (no `_orig_mod.`/`module.` prefixes; tied head stored once)
  model_config.json   the ModelConfig fields — enough to rebuild the model
  tokenizer.json      the tokenizer the model was trained with (special_tokens.json beside it, if any)
  config.yaml         the full resolved training config
  optimizer.pt        optimizer state (tensors and plain values: loads with weights_only=True)
  rng.pt              torch RNG states, as tensors
  state.json          the run's counters (checkpoint/run_state.py): it marks the directory complete
  manifest.json       every file above with its size and SHA-256 (checkpoint/manifest.py), written last
Nothing here is unpickled as arbitrary objects: safetensors, JSON and `torch.load(weights_only=True)`.
"""
import json
import re
from pathlib import Path
from typing import List, Optional

import torch
from safetensors import SafetensorError, safe_open

from model import ModelConfig
from training.checkpoint.errors import CheckpointError
from training.checkpoint.manifest import MANIFEST, damage
from training.checkpoint.run_state import read_state
from training.runtime.run_files import CHECKPOINTS, CONFIG, STATE

WEIGHTS, MODEL_CONFIG, TOKENIZER, OPTIMIZER, RNG = (
    "model.safetensors", "model_config.json", "tokenizer.json", "optimizer.pt", "rng.pt")  # CONFIG, STATE: runtime/run_files.py
REQUIRED_FILES = (WEIGHTS, MODEL_CONFIG, TOKENIZER, STATE)
TIED_KEY = "lm_head.weight"
STEP_DIR = re.compile(r"step_(\d+)")
BEST = "best"  # checkpoints/best/step_N: the lowest validation bpb so far


def checkpoint_name(step: int) -> str:
    return f"step_{step:07d}"


def checkpoint_step(path: Path) -> Optional[int]:
    """N for a `step_N` directory name, None for anything else (`.tmp`, `.old`, `best`, …)."""
    match = STEP_DIR.fullmatch(Path(path).name)
    return int(match.group(1)) if match else None


def list_checkpoints(ckpt_root: Path) -> list:
    """Complete checkpoints under ckpt_root, oldest first (half-written `.tmp` dirs are ignored)."""
    if not Path(ckpt_root).is_dir():
        return []
    found = [p for p in Path(ckpt_root).iterdir()
             if p.is_dir() and checkpoint_step(p) is not None and (p / STATE).exists()]
    return sorted(found, key=checkpoint_step)  # by number: step_10000000 comes after step_9999999


def run_checkpoints(ckpt_root: Path) -> list:
    """A run's complete checkpoints, oldest first: its step_N and its best/step_N (a run that stopped between its
    first evaluation and its first periodic save has only the second). A step held by both: the step_N one."""
    steps = list_checkpoints(ckpt_root)
    saved = {checkpoint_step(c) for c in steps}
    best = [c for c in list_checkpoints(Path(ckpt_root) / BEST) if checkpoint_step(c) not in saved]
    return sorted(steps + best, key=checkpoint_step)


def last_good_checkpoint(ckpt_root: Path) -> Optional[Path]:
    """The run's newest complete checkpoint (best/ included) whose weights are finite and whose files match
    their manifest (hashing it: about a second per GB), or None."""
    for ckpt in reversed(run_checkpoints(ckpt_root)):
        try:
            if _weights_finite(ckpt) and damage(ckpt) is None:
                return ckpt
        except CheckpointError:  # an unreadable manifest: not a checkpoint to fall back on
            continue
    return None


def _weights_finite(ckpt: Path) -> bool:
    try:
        flag = read_state(ckpt).get("weights_finite")
        if flag is not None:
            return bool(flag)
        with safe_open(str(ckpt / WEIGHTS), framework="pt") as f:  # written before the flag existed
            return all(not nonfinite_tensors(f.get_tensor(k)) for k in f.keys())
    except (OSError, ValueError, SafetensorError):  # unreadable: not a checkpoint to fall back on
        return False


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


def resolve_checkpoint(path: str, outputs_dir: str = "outputs") -> Path:
    """A checkpoint dir, a run dir (→ its newest checkpoint, best/ included), `latest` (→ the newest checkpoint under
    outputs_dir) or `best` (→ the lowest-validation-bpb checkpoint of the newest run under outputs_dir
    that has one: checkpoints/best/)."""
    if path in ("latest", BEST):
        roots = Path(outputs_dir).glob(f"**/{CHECKPOINTS}" + ("/" + BEST if path == BEST else ""))
        candidates = [c for root in roots for c in run_checkpoints(root)]
        if not candidates:
            raise CheckpointError(f"'{path}' found no {'best ' if path == BEST else ''}checkpoint under {outputs_dir}/; "
                                  "train first or pass a checkpoint directory")
        return max(candidates, key=lambda p: (p / STATE).stat().st_mtime)
    p = Path(path)
    if not p.exists():
        raise CheckpointError(f"{path} does not exist; pass a checkpoint directory, a run directory, 'latest' or "
                              "'best'")
    if (p / CHECKPOINTS).is_dir() or _is_run_dir(p):
        ckpts = run_checkpoints(p / CHECKPOINTS)
        if not ckpts:
            raise CheckpointError(f"run directory {path} has no complete checkpoint (it stopped before its first "
                                  "checkpoint was written): start the run again")
        return ckpts[-1]
    if run_checkpoints(p):  # a directory of step_* checkpoints
        return run_checkpoints(p)[-1]
    missing = [f for f in REQUIRED_FILES if not (p / f).exists()]
    if missing and not (p / MANIFEST).is_file():  # with a manifest, verification names what is missing
        raise CheckpointError(f"{path} is not a minillama checkpoint (missing {', '.join(missing)}); "
                              "pass a directory like outputs/<run>/checkpoints/step_0001000")
    return p


def run_dir_of(ckpt: Path) -> Path:
    """The run directory a checkpoint belongs to: <run>/checkpoints/step_N or <run>/checkpoints/best/step_N."""
    return next(p.parent for p in Path(ckpt).parents if p.name == CHECKPOINTS)


def _is_run_dir(path: Path) -> bool:
    """A run directory that has not written a checkpoint yet: train.py writes config.yaml first."""
    return (path / CONFIG).is_file() and not (path / MODEL_CONFIG).exists()


def load_model_config(ckpt: Path) -> ModelConfig:
    try:
        fields = json.loads((Path(ckpt) / MODEL_CONFIG).read_text())
        return ModelConfig.from_dict(fields)
    except (OSError, json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f"{ckpt}/{MODEL_CONFIG} is unreadable or invalid ({e}); the checkpoint is damaged")
