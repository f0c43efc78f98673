"""Import a Hugging Face Llama directory (safetensors weights + tokenizer.json) as a minillama checkpoint."""
import contextlib
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Dict, Optional, Tuple

import torch
from safetensors.torch import load_file
from tokenizers import Tokenizer

from data.tokenizer import ROLES, SPECIAL_TOKENS_FILE, max_token_id, write_special_tokens
from interop.hf import ConversionError, from_hf_state_dict, model_config_from_hf
from training.checkpoint import list_checkpoints, save_checkpoint
from training.checkpoint.format import MODEL_CONFIG, nonfinite_tensors
from training.checkpoint.manifest import verify as verify_files
from training.runtime.run_files import RunFiles

INDEX_FILE = "model.safetensors.index.json"


def is_hf_directory(path) -> bool:
    """A Hugging Face model directory (config.json) that is not a minillama checkpoint (model_config.json)."""
    return (Path(path) / "config.json").is_file() and not (Path(path) / MODEL_CONFIG).exists()


def checkpoint_for(path: str, stack: contextlib.ExitStack, verify: bool = True) -> Tuple[str, Optional[str]]:
    """(a checkpoint to load for `path`, what to call it or None). A Hugging Face Llama directory becomes a
    temporary checkpoint — the same checks as scripts/import_hf.py — deleted when `stack` closes; any other
    path is returned as given, for resolve_checkpoint to find or refuse. generate.py and evaluate.py both
    take either."""
    if not is_hf_directory(path):
        return path, None
    staged = import_checkpoint(path, stack.enter_context(tempfile.TemporaryDirectory()), verify=verify)
    return str(staged), f"{path} (Hugging Face)"


def cached_import(hf_dir: str, cache_dir: str, verify: bool = True) -> Path:
    """`hf_dir` imported once into `<cache_dir>/imported/<key>/` (train.py's init_from: the run's config names the
    directory, so a resume or a second run finds it again); the key is the directory's path and its files' names,
    sizes and modification times — an edited or replaced file imports anew. Returns the checkpoint directory."""
    hf = Path(hf_dir).resolve()
    stamp = [str(hf)] + [f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(hf.iterdir()) if p.is_file()]
    folder = Path(cache_dir) / "imported" / hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    found = list_checkpoints(RunFiles(folder).checkpoints)
    if found:
        return found[-1]
    tmp = folder.with_name(f"{folder.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        import_checkpoint(str(hf), str(tmp), verify=verify)
        tmp.rename(folder)
    except OSError:  # another process imported the same directory meanwhile: use theirs
        if not list_checkpoints(RunFiles(folder).checkpoints):
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return list_checkpoints(RunFiles(folder).checkpoints)[-1]


def import_checkpoint(hf_dir: str, run_dir: str, verify: bool = True) -> Path:
    """Convert `hf_dir` into `run_dir/checkpoints/step_0000000`; returns that checkpoint directory.

    Only safetensors are read: pickled `pytorch_model.bin` files can run code when loaded, and
    nothing from the files is executed (no `trust_remote_code`). A directory minillama exported carries
    a manifest.json, checked unless `verify` is off; NaN/inf weights are refused either way.
    """
    hf = Path(hf_dir)
    if verify and (hf / "config.json").is_file():
        verify_files(hf, warn=lambda message: print(message, file=sys.stderr),
                     unverifiable="not exported by minillama: Hugging Face directories carry no checksums")
    config = _read_json(hf / "config.json", f"{hf} is not a Hugging Face model directory (no readable config.json)")
    tokenizer = _read_tokenizer(hf)
    # The embedding may have more rows than the tokenizer has ids (a padded vocabulary): the
    # tokenizer sets vocab_size, config.json the row count.
    cfg = model_config_from_hf(config, n_tokens=max_token_id(tokenizer) + 1)
    state = from_hf_state_dict(read_hf_weights(hf), cfg)
    bad = nonfinite_tensors(state)
    if bad:
        raise ConversionError(f"{hf}: the weights hold NaN or inf ({bad[0]}, {len(bad)} tensor(s)); nothing imported")
    roles = _hf_special_tokens(hf, config, tokenizer)
    ckpt_root = RunFiles(run_dir).checkpoints
    if list_checkpoints(ckpt_root):  # the import (step 0) would hide behind them, or clobber one
        raise FileExistsError(f"{ckpt_root} already holds checkpoints; import into a new run directory")
    with tempfile.TemporaryDirectory() as staging:
        # The roles travel next to the tokenizer.json, as in every checkpoint, so whatever copies the
        # tokenizer onward (the data cache, a fine-tune's checkpoints) can carry them forward.
        shutil.copyfile(hf / "tokenizer.json", Path(staging) / "tokenizer.json")
        write_special_tokens(staging, roles)
        note = f"# imported from {hf.resolve()} by scripts/import_hf.py; no training config\n"
        ckpt = save_checkpoint(ckpt_root, 0, state, cfg, Path(staging) / "tokenizer.json",
                               state={"step": 0, "tokens_seen": 0, "elapsed_s": 0.0,
                                      "imported_from": str(hf.resolve())},
                               config_yaml=note, keep_last=0)
    if not (ckpt / SPECIAL_TOKENS_FILE).exists():  # a checkpoint writer that copies only tokenizer.json
        write_special_tokens(ckpt, roles)
    return ckpt


def read_hf_weights(hf: Path) -> Dict[str, torch.Tensor]:
    """model.safetensors, or the shards named by model.safetensors.index.json."""
    if (hf / "model.safetensors").exists():
        files = [hf / "model.safetensors"]
    elif (hf / INDEX_FILE).exists():
        index = _read_json(hf / INDEX_FILE, f"{hf / INDEX_FILE} is unreadable")
        files = [hf / name for name in sorted(set(index.get("weight_map", {}).values()))]
        if not files:
            raise ConversionError(f"{hf / INDEX_FILE} has no weight_map entries")
    elif list(hf.glob("*.bin")) or list(hf.glob("*.pt")):
        raise ConversionError(f"{hf} has only pickled weights (*.bin/*.pt), which can run code when loaded; "
                              "convert them to safetensors first, in an environment you trust")
    else:
        raise ConversionError(f"{hf} has no model.safetensors or {INDEX_FILE}")
    weights = {}
    for path in files:
        try:
            weights.update(load_file(str(path)))
        except Exception as e:  # safetensors raises its own error types for missing/corrupt files
            raise ConversionError(f"{path} is missing, corrupt or not safetensors ({e})")
    return weights


def _read_tokenizer(hf: Path) -> Tokenizer:
    path = hf / "tokenizer.json"
    if not path.exists():
        raise ConversionError(f"{hf} has no tokenizer.json (a fast tokenizer); minillama checkpoints need one "
                              "— save the tokenizer with AutoTokenizer(...).save_pretrained() first")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:
        raise ConversionError(f"{path} is unreadable ({e})")


def _hf_special_tokens(hf: Path, config: dict, tokenizer: Tokenizer) -> Dict[str, Optional[str]]:
    """Roles from tokenizer_config.json (strings), else config.json (ids) — the two places HF keeps them."""
    tok_config = _read_json(hf / "tokenizer_config.json", "") if (hf / "tokenizer_config.json").exists() else {}
    roles = {}
    for role in ROLES:
        token = tok_config.get(f"{role}_token")
        if isinstance(token, dict):  # older files store AddedToken objects as dicts
            token = token.get("content")
        if token is None and isinstance(config.get(f"{role}_token_id"), int):
            token = tokenizer.id_to_token(config[f"{role}_token_id"])
        roles[role] = token if isinstance(token, str) and tokenizer.token_to_id(token) is not None else None
    return roles


def _read_json(path: Path, error: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(error or f"{path} is unreadable ({e})")
    if not isinstance(value, dict):
        raise ConversionError(f"{path} should hold a JSON object")
    return value
