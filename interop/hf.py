"""Hugging Face Llama → minillama: a LlamaForCausalLM directory (safetensors weights, config.json, tokenizer.json)
becomes a verified minillama checkpoint — for init_from=, generate.py and evaluate.py. Only safetensors are read
(pickled weights can run code) and nothing from the directory is executed. The export side is interop/hf_export.py."""

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

from data.tokenizer import ROLES, max_token_id, write_special_tokens
from model import ModelConfig, find_multiple, swiglu_intermediate_size
from training.checkpoint import (
    FORMAT_VERSION,
    MANIFEST,
    MODEL_CONFIG,
    TOKENIZER,
    RunFiles,
    RunState,
    list_checkpoints,
    nonfinite_tensors,
    save_checkpoint,
)
from training.checkpoint import verify as verify_files

MINILLAMA_CONFIG_KEY = "minillama_config"  # our export's full ModelConfig, for the fields HF has no slot for
INDEX_FILE = "model.safetensors.index.json"
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}  # ours → HF's, per layer; gate_up_proj is split


class ConversionError(ValueError):
    """A model or directory that cannot be converted between minillama and Hugging Face formats."""


def is_hf_directory(path) -> bool:
    """A Hugging Face model directory (config.json) that is not a minillama checkpoint (model_config.json)."""
    return (Path(path) / "config.json").is_file() and not (Path(path) / MODEL_CONFIG).exists()


def model_config_from_hf(config: dict, n_tokens: Optional[int] = None) -> ModelConfig:
    """A ModelConfig from a Llama config.json, refusing what our model does not implement. config.json's vocab_size
    counts embedding rows; `n_tokens` (the tokenizer's max id + 1) may be fewer: the rest become padding."""
    kind = config.get("model_type")
    if kind != "llama" and "LlamaForCausalLM" not in (config.get("architectures") or []):
        raise ConversionError(
            f"config.json describes a {kind!r} model; only Llama models (model_type 'llama', "
            "LlamaForCausalLM) can be imported"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act={config['hidden_act']!r}; minillama's SwiGLU needs 'silu'")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConversionError("attention_bias/mlp_bias is true; minillama's projections have no biases")
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key) or {}
        if (
            rope.get("rope_type", rope.get("type", "default")) != "default"
            or rope.get("partial_rotary_factor", 1.0) != 1.0
        ):
            raise ConversionError(
                f"{key} asks for {rope.get('rope_type', rope.get('type'))!r} RoPE (or a partial rotary "
                "factor); minillama implements only the default RoPE"
            )
    try:
        hidden, intermediate = int(config["hidden_size"]), int(config["intermediate_size"])
        rows = int(config["vocab_size"])
        n_tokens = rows if n_tokens is None else n_tokens
        if n_tokens > rows:
            raise ConversionError(
                f"the tokenizer has token ids up to {n_tokens - 1} but config.json's vocab_size={rows} "
                f"gives the embedding only {rows} rows; they do not belong together"
            )
        n_heads = int(config["num_attention_heads"])
        derived = ModelConfig(
            vocab_size=n_tokens,
            vocab_multiple=next(
                m for m in (64, 256, 128, 32, 16, 8, 4, 2, 1, rows) if find_multiple(n_tokens, m) == rows
            ),
            hidden_size=hidden,
            n_layers=int(config["num_hidden_layers"]),
            n_heads=n_heads,
            n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
            intermediate_size=intermediate,
            multiple_of=next(
                (m for m in (256, 128, 64, 32, 16, 8, 1) if swiglu_intermediate_size(hidden, m) == intermediate), 256
            ),
            max_seq_len=int(config.get("max_position_embeddings", 2048)),
            norm="rmsnorm",
            mlp="swiglu",
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            rope_theta=float(
                (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta", 10000.0))
            ),
            init_std=float(config.get("initializer_range", 0.02)),
        )
    except KeyError as e:
        raise ConversionError(f"config.json lacks {e.args[0]!r}, which every Llama config has")
    except ConversionError:
        raise
    except (TypeError, ValueError) as e:
        raise ConversionError(f"config.json describes a model minillama cannot build: {e}")
    if config.get("head_dim") not in (None, derived.head_dim):
        raise ConversionError(
            f"config.json has head_dim={config['head_dim']}, but minillama requires hidden_size / "
            f"num_attention_heads = {derived.head_dim}"
        )
    try:  # our export's embedded config, if it still describes the same network
        saved = ModelConfig(**config[MINILLAMA_CONFIG_KEY])
    except (KeyError, TypeError, ValueError, AttributeError):
        return derived
    network = (  # what the weights' shapes and numerics depend on
        "padded_vocab_size hidden_size n_layers n_heads resolved_n_kv_heads resolved_intermediate_size max_seq_len "
        "norm mlp qk_norm norm_eps rope_theta tie_embeddings"
    ).split()
    same = all(getattr(saved, key) == getattr(derived, key) for key in network)
    return saved if same and saved.vocab_size >= derived.vocab_size else derived


def from_hf_state_dict(hf: Dict[str, torch.Tensor], cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """LlamaForCausalLM's state dict → ours, every expected name and shape checked. q/k need no permutation: our RoPE
    uses HF's rotate-half layout."""
    hf = {k: v for k, v in hf.items() if not k.endswith("rotary_emb.inv_freq")}  # old files' recomputable buffer
    d, kv, inter = cfg.hidden_size, cfg.resolved_n_kv_heads * cfg.head_dim, cfg.resolved_intermediate_size
    per_layer = {
        "input_layernorm.weight": (d,),
        "post_attention_layernorm.weight": (d,),
        "self_attn.q_proj.weight": (cfg.n_heads * cfg.head_dim, d),
        "self_attn.k_proj.weight": (kv, d),
        "self_attn.v_proj.weight": (kv, d),
        "self_attn.o_proj.weight": (d, cfg.n_heads * cfg.head_dim),
        "mlp.gate_proj.weight": (inter, d),
        "mlp.up_proj.weight": (inter, d),
        "mlp.down_proj.weight": (d, inter),
    }
    expected = {
        "model.embed_tokens.weight": (cfg.padded_vocab_size, d),
        "model.norm.weight": (d,),
        **{f"model.layers.{i}.{k}": s for i in range(cfg.n_layers) for k, s in per_layer.items()},
        **({} if cfg.tie_embeddings else {"lm_head.weight": (cfg.padded_vocab_size, d)}),
    }
    if not cfg.tie_embeddings and "lm_head.weight" not in hf:
        raise ConversionError("tie_word_embeddings is false but the weights have no lm_head.weight")
    missing = sorted(set(expected) - set(hf))
    unexpected = sorted(set(hf) - set(expected) - {"lm_head.weight"})  # an extra copy of a tied head is fine
    if missing or unexpected:
        raise ConversionError(
            f"the weights do not match a Llama model with this config.json (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]})"
        )
    for name, shape in expected.items():
        if tuple(hf[name].shape) != shape:
            raise ConversionError(f"weight {name} has shape {tuple(hf[name].shape)}; config.json implies {shape}")
    ours = {"embed_tokens.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    for i in range(cfg.n_layers):
        ours.update({f"layers.{i}.{name}": hf[f"model.layers.{i}.{theirs}"] for name, theirs in LAYER_NAMES.items()})
        ours[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(  # SwiGLU chunks its output as (gate, up)
            [hf[f"model.layers.{i}.mlp.gate_proj.weight"], hf[f"model.layers.{i}.mlp.up_proj.weight"]], dim=0
        )
    ours["lm_head.weight"] = ours["embed_tokens.weight"] if cfg.tie_embeddings else hf["lm_head.weight"]
    return ours


def _read_json(path: Path, error: str) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConversionError(error or f"{path} is unreadable ({e})")
    if not isinstance(value, dict):
        raise ConversionError(f"{path} should hold a JSON object")
    return value


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
        raise ConversionError(
            f"{hf} has only pickled weights (*.bin/*.pt), which can run code when loaded; convert "
            "them to safetensors first, in an environment you trust"
        )
    else:
        raise ConversionError(f"{hf} has no model.safetensors or {INDEX_FILE}")
    weights = {}
    for path in files:
        try:
            weights.update(load_file(str(path)))
        except Exception as e:  # safetensors' own error types for missing or corrupt files
            raise ConversionError(f"{path} is missing, corrupt or not safetensors ({e})")
    return weights


def import_checkpoint(hf_dir: str, run_dir: str, verify: bool = True) -> Path:
    """Convert `hf_dir` into run_dir/checkpoints/step_0000000 and return it. A directory minillama exported carries a
    manifest.json, checked unless `verify` is off; NaN/inf weights are refused either way."""
    hf = Path(hf_dir)
    if verify and (hf / MANIFEST).is_file():  # exported by minillama: its files must be what it wrote
        verify_files(hf)
    elif verify and (hf / "config.json").is_file():
        print(
            f"warning: {hf} has no {MANIFEST} (Hugging Face directories carry no checksums): unverified",
            file=sys.stderr,
        )
    config = _read_json(hf / "config.json", f"{hf} is not a Hugging Face model directory (no readable config.json)")
    if not (hf / "tokenizer.json").exists():
        raise ConversionError(
            f"{hf} has no tokenizer.json (a fast tokenizer); minillama checkpoints need one — save "
            "the tokenizer with AutoTokenizer(...).save_pretrained() first"
        )
    try:
        tokenizer = Tokenizer.from_file(str(hf / "tokenizer.json"))
    except Exception as e:
        raise ConversionError(f"{hf / 'tokenizer.json'} is unreadable ({e})")
    cfg = model_config_from_hf(config, n_tokens=max_token_id(tokenizer) + 1)  # the tokenizer sets vocab_size
    state = from_hf_state_dict(read_hf_weights(hf), cfg)
    if bad := nonfinite_tensors(state):
        raise ConversionError(f"{hf}: the weights hold NaN or inf ({bad[0]}, {len(bad)} tensor(s)); nothing imported")
    # The roles: tokenizer_config.json's strings, else config.json's ids — the two places HF keeps them.
    tok_config = _read_json(hf / "tokenizer_config.json", "") if (hf / "tokenizer_config.json").exists() else {}
    roles = {}
    for role in ROLES:
        token = tok_config.get(f"{role}_token")
        token = token.get("content") if isinstance(token, dict) else token  # older files store AddedToken dicts
        if token is None and isinstance(config.get(f"{role}_token_id"), int):
            token = tokenizer.id_to_token(config[f"{role}_token_id"])
        roles[role] = token if isinstance(token, str) and tokenizer.token_to_id(token) is not None else None
    root = RunFiles(run_dir).checkpoints
    if list_checkpoints(root):  # the import (step 0) would hide behind them, or clobber one
        raise FileExistsError(f"{root} already holds checkpoints; import into a new run directory")
    with tempfile.TemporaryDirectory() as staging:  # the roles travel next to tokenizer.json, as in every checkpoint
        write_special_tokens(staging, roles)
        tokenizer_files = {TOKENIZER: (hf / "tokenizer.json").read_bytes()}
        tokenizer_files |= {p.name: p.read_bytes() for p in Path(staging).iterdir()}
    config = f"# imported from {hf.resolve()} by scripts/import_hf.py; no training config\n"
    return save_checkpoint(root, 0, state, cfg, tokenizer_files, RunState().to_json(), config, keep_last=0)


def checkpoint_for(path: str, stack: contextlib.ExitStack, verify: bool = True) -> Tuple[str, Optional[str]]:
    """(a checkpoint to load for `path`, what to call it or None): a Hugging Face directory becomes a temporary
    checkpoint, deleted when `stack` closes; any other path is returned as given (generate.py, evaluate.py)."""
    if not is_hf_directory(path):
        return path, None
    ckpt = import_checkpoint(path, stack.enter_context(tempfile.TemporaryDirectory()), verify)
    return str(ckpt), f"{path} (Hugging Face)"


def cached_import(hf_dir: str, cache_dir: str, verify: bool = True) -> Path:
    """`hf_dir` imported once into <cache_dir>/imported/<key>/ (init_from: a resume or a second run finds it again),
    keyed by its path and its files' names, sizes and times — an edited file imports anew. Its checkpoint."""
    hf = Path(hf_dir).resolve()
    stamp = [str(hf), f"checkpoint format {FORMAT_VERSION}"] + [
        f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in sorted(hf.iterdir()) if p.is_file()
    ]
    folder = Path(cache_dir) / "imported" / hashlib.sha256("\n".join(stamp).encode()).hexdigest()[:16]
    if found := list_checkpoints(RunFiles(folder).checkpoints):
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
