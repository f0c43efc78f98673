"""The mapping between minillama and Hugging Face `LlamaForCausalLM`: config fields and weight names.

Pure functions on dicts and tensors; `transformers` is imported only where an HF object is built,
so the rest of minillama runs without it.
"""
import dataclasses
from typing import Dict, Optional

import torch

from model import ModelConfig, Transformer, find_multiple, swiglu_intermediate_size

# Where our exported config.json keeps the full ModelConfig, so that fields HF has no slot for
# (multiple_of, ffn_dim_multiplier, dropout, init_std) survive export → import exactly.
MINILLAMA_CONFIG_KEY = "minillama_config"
# Ours → HF, per layer. Our fused gate_up_proj is split into HF's gate_proj and up_proj.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q_proj.weight": "self_attn.q_proj.weight",
    "attn.k_proj.weight": "self_attn.k_proj.weight",
    "attn.v_proj.weight": "self_attn.v_proj.weight",
    "attn.o_proj.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# Buffers some older HF checkpoints saved; they are recomputed from the config, so never needed.
IGNORED_HF_SUFFIXES = ("rotary_emb.inv_freq",)


class ConversionError(ValueError):
    """A model or directory that cannot be converted between minillama and Hugging Face formats."""


def check_llama_compatible(cfg: ModelConfig) -> None:
    if (cfg.norm, cfg.mlp, cfg.qk_norm) != ("rmsnorm", "swiglu", False):
        raise ConversionError(
            f"this model uses norm={cfg.norm!r}, mlp={cfg.mlp!r}, qk_norm={cfg.qk_norm}; only rmsnorm + swiglu "
            "models without qk_norm are LLaMA-compatible, so only those can be exported to Hugging Face")


def to_hf_state_dict(state: Dict[str, torch.Tensor], cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """Our state dict → LlamaForCausalLM's. q/k need no permutation: our RoPE already uses HF's
    rotate-half layout (model/rope.py); tests/test_interop_hf.py checks that the logits agree."""
    check_llama_compatible(cfg)
    hf = {"model.embed_tokens.weight": state["embed_tokens.weight"], "model.norm.weight": state["norm.weight"]}
    for i in range(cfg.n_layers):
        for ours, theirs in LAYER_NAMES.items():
            hf[f"model.layers.{i}.{theirs}"] = state[f"layers.{i}.{ours}"]
        # SwiGLU.forward chunks gate_up_proj's output as (gate, up): the first half of the rows is gate.
        gate, up = state[f"layers.{i}.mlp.gate_up_proj.weight"].chunk(2, dim=0)
        hf[f"model.layers.{i}.mlp.gate_proj.weight"] = gate.clone()  # clone: safetensors refuses views
        hf[f"model.layers.{i}.mlp.up_proj.weight"] = up.clone()
    if not cfg.tie_embeddings:  # a tied head is the embedding; HF re-ties it from tie_word_embeddings
        hf["lm_head.weight"] = state["lm_head.weight"]
    return {k: v.detach().contiguous() for k, v in hf.items()}


def from_hf_state_dict(hf: Dict[str, torch.Tensor], cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """LlamaForCausalLM's state dict → ours, with every expected name and shape checked."""
    hf = {k: v for k, v in hf.items() if not k.endswith(IGNORED_HF_SUFFIXES)}
    expected = _expected_hf_shapes(cfg)
    if not cfg.tie_embeddings and "lm_head.weight" not in hf:
        raise ConversionError("tie_word_embeddings is false but the weights have no lm_head.weight")
    missing = sorted(set(expected) - set(hf))
    unexpected = sorted(set(hf) - set(expected) - {"lm_head.weight"})  # an extra copy of a tied head is fine
    if missing or unexpected:
        raise ConversionError(f"the weights do not match a Llama model with this config.json "
                              f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
    for name, shape in expected.items():
        if tuple(hf[name].shape) != shape:
            raise ConversionError(f"weight {name} has shape {tuple(hf[name].shape)}; config.json implies {shape}")
    ours = {"embed_tokens.weight": hf["model.embed_tokens.weight"], "norm.weight": hf["model.norm.weight"]}
    for i in range(cfg.n_layers):
        for our_name, hf_name in LAYER_NAMES.items():
            ours[f"layers.{i}.{our_name}"] = hf[f"model.layers.{i}.{hf_name}"]
        ours[f"layers.{i}.mlp.gate_up_proj.weight"] = torch.cat(
            [hf[f"model.layers.{i}.mlp.gate_proj.weight"], hf[f"model.layers.{i}.mlp.up_proj.weight"]], dim=0)
    ours["lm_head.weight"] = ours["embed_tokens.weight"] if cfg.tie_embeddings else hf["lm_head.weight"]
    return ours


def _expected_hf_shapes(cfg: ModelConfig) -> Dict[str, tuple]:
    with torch.device("meta"):  # shapes only: no memory, no init cost even for a large model
        ours = Transformer(cfg).state_dict()
    shapes = {k: tuple(v.shape) for k, v in to_hf_state_dict(ours, cfg).items()}
    if cfg.tie_embeddings:
        shapes.pop("lm_head.weight", None)
    return shapes


def llama_config_fields(cfg: ModelConfig, token_ids: Dict[str, Optional[int]]) -> dict:
    """The LlamaConfig keyword arguments that describe this model (and its special-token ids)."""
    check_llama_compatible(cfg)
    # HF's vocab_size is the embedding's row count: the padded size. The tokenizer has fewer tokens.
    return dict(
        architectures=["LlamaForCausalLM"], vocab_size=cfg.padded_vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.resolved_intermediate_size, num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads, num_key_value_heads=cfg.resolved_n_kv_heads, head_dim=cfg.head_dim,
        hidden_act="silu", max_position_embeddings=cfg.max_seq_len, initializer_range=cfg.init_std,
        rms_norm_eps=cfg.norm_eps, tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False, mlp_bias=False, bos_token_id=token_ids.get("bos"),
        eos_token_id=token_ids.get("eos"), pad_token_id=token_ids.get("pad"),
        **{MINILLAMA_CONFIG_KEY: dataclasses.asdict(cfg)})


def llama_config(cfg: ModelConfig, token_ids: Dict[str, Optional[int]]):
    from transformers import LlamaConfig  # interop-only dependency

    return LlamaConfig(**llama_config_fields(cfg, token_ids))


def model_config_from_hf(config: dict, n_tokens: Optional[int] = None) -> ModelConfig:
    """A ModelConfig from a Llama config.json (as a dict), refusing what our model does not implement.

    config.json's vocab_size counts embedding rows; `n_tokens` (the tokenizer's max id + 1) may be
    smaller: the rows above it become the padding of a padded vocabulary.
    """
    _check_supported(config)
    rope = config.get("rope_parameters") or {}
    try:
        hidden, n_heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        intermediate, rows = int(config["intermediate_size"]), int(config["vocab_size"])
        n_tokens = rows if n_tokens is None else n_tokens
        if n_tokens > rows:
            raise ConversionError(f"the tokenizer has token ids up to {n_tokens - 1} but config.json's vocab_size="
                                  f"{rows} gives the embedding only {rows} rows; they do not belong together")
        derived = ModelConfig(
            vocab_size=n_tokens, vocab_multiple=_vocab_multiple_for(n_tokens, rows), hidden_size=hidden,
            n_layers=int(config["num_hidden_layers"]),
            n_heads=n_heads, n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
            multiple_of=_multiple_of_for(hidden, intermediate), intermediate_size=intermediate,
            max_seq_len=int(config.get("max_position_embeddings", 2048)), norm="rmsnorm", mlp="swiglu",
            norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
            tie_embeddings=bool(config.get("tie_word_embeddings", False)),
            init_std=float(config.get("initializer_range", 0.02)))
    except KeyError as e:
        raise ConversionError(f"config.json lacks {e.args[0]!r}, which every Llama config has")
    except ConversionError:
        raise
    except (TypeError, ValueError) as e:
        raise ConversionError(f"config.json describes a model minillama cannot build: {e}")
    if config.get("head_dim") not in (None, derived.head_dim):
        raise ConversionError(f"config.json has head_dim={config['head_dim']}, but minillama requires "
                              f"hidden_size / num_attention_heads = {derived.head_dim}")
    return _restore_minillama_fields(derived, config.get(MINILLAMA_CONFIG_KEY))


def _check_supported(config: dict) -> None:
    kind = config.get("model_type")
    if kind != "llama" and "LlamaForCausalLM" not in (config.get("architectures") or []):
        raise ConversionError(f"config.json describes a {kind!r} model; only Llama models "
                              "(model_type 'llama', LlamaForCausalLM) can be imported")
    if config.get("hidden_act", "silu") != "silu":
        raise ConversionError(f"hidden_act={config['hidden_act']!r}; minillama's SwiGLU needs 'silu'")
    if config.get("attention_bias") or config.get("mlp_bias"):
        raise ConversionError("attention_bias/mlp_bias is true; minillama's projections have no biases")
    for key in ("rope_parameters", "rope_scaling"):
        rope = config.get(key) or {}
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default" or rope.get("partial_rotary_factor", 1.0) != 1.0:
            raise ConversionError(f"{key} asks for {rope_type!r} RoPE (or a partial rotary factor); "
                                  "minillama implements only the default RoPE")


def _multiple_of_for(hidden_size: int, intermediate_size: int) -> int:
    """The coarsest rounding LLaMA's width rule would need to produce this intermediate_size.

    Only cosmetic: intermediate_size is also set explicitly, so the model is right either way.
    """
    for m in (256, 128, 64, 32, 16, 8, 1):
        if swiglu_intermediate_size(hidden_size, m) == intermediate_size:
            return m
    return 256


def _vocab_multiple_for(n_tokens: int, rows: int) -> int:
    """A vocab_multiple that pads n_tokens to exactly `rows`: the default 64 if it does, else the
    largest power of two that does, else `rows` itself (which always does, as n_tokens <= rows)."""
    for m in (64, 256, 128, 32, 16, 8, 4, 2, 1):
        if find_multiple(n_tokens, m) == rows:
            return m
    return rows


def _restore_minillama_fields(derived: ModelConfig, saved: Optional[dict]) -> ModelConfig:
    """Use the ModelConfig our export embedded, but only if it still describes the same network."""
    if not isinstance(saved, dict):
        return derived
    try:
        candidate = ModelConfig.from_dict(saved)
    except (TypeError, ValueError):
        return derived
    same_network = _network(candidate) == _network(derived) and candidate.vocab_size >= derived.vocab_size
    return candidate if same_network else derived


def _network(cfg: ModelConfig) -> tuple:
    """What config.json states itself; the other fields come from MINILLAMA_CONFIG_KEY. vocab_size
    is not here: a model may have more ids than its tokenizer uses (checked against the tokenizer)."""
    return (cfg.padded_vocab_size, cfg.hidden_size, cfg.n_layers, cfg.n_heads, cfg.resolved_n_kv_heads,
            cfg.resolved_intermediate_size, cfg.max_seq_len, cfg.norm, cfg.mlp, cfg.qk_norm, cfg.norm_eps,
            cfg.rope_theta, cfg.tie_embeddings)
