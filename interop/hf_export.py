"""minillama → Hugging Face: a checkpoint exported as a LlamaForCausalLM directory (model, config, tokenizer,
generation config), loadable by AutoModelForCausalLM / AutoTokenizer.from_pretrained. The import side: interop/hf.py."""

import dataclasses
import math
import shutil
import sys
from pathlib import Path
from typing import Dict, Optional

import torch
from safetensors.torch import save as save_safetensors

from data.tokenizer import read_special_tokens, token_ids
from interop.hf import LAYER_NAMES, MINILLAMA_CONFIG_KEY, ConversionError
from model import ModelConfig, Transformer
from training.checkpoint import (
    MANIFEST,
    TOKENIZER,
    load_model,
    load_model_config,
    resolve_checkpoint,
    write_file,
    write_manifest,
)


def check_llama_compatible(cfg: ModelConfig) -> None:
    if (cfg.norm, cfg.mlp, cfg.qk_norm) != ("rmsnorm", "swiglu", False):
        raise ConversionError(
            f"this model uses norm={cfg.norm!r}, mlp={cfg.mlp!r}, qk_norm={cfg.qk_norm}; only rmsnorm + swiglu "
            "models without qk_norm are LLaMA-compatible, so only those can be exported to Hugging Face"
        )


def to_hf_state_dict(state: Dict[str, torch.Tensor], cfg: ModelConfig) -> Dict[str, torch.Tensor]:
    """Our state dict → LlamaForCausalLM's: gate_up_proj split into gate_proj and up_proj (its first half is gate);
    q/k need no permutation (our RoPE is HF's rotate-half layout; tests/test_interop_hf.py checks the logits)."""
    check_llama_compatible(cfg)
    hf = {"model.embed_tokens.weight": state["embed_tokens.weight"], "model.norm.weight": state["norm.weight"]}
    for i in range(cfg.n_layers):
        for ours, theirs in LAYER_NAMES.items():
            hf[f"model.layers.{i}.{theirs}"] = state[f"layers.{i}.{ours}"]
        gate, up = state[f"layers.{i}.mlp.gate_up_proj.weight"].chunk(2, dim=0)
        hf[f"model.layers.{i}.mlp.gate_proj.weight"] = gate.clone()  # clone: safetensors refuses views
        hf[f"model.layers.{i}.mlp.up_proj.weight"] = up.clone()
    if not cfg.tie_embeddings:  # a tied head is the embedding; HF re-ties it from tie_word_embeddings
        hf["lm_head.weight"] = state["lm_head.weight"]
    return {k: v.detach().contiguous() for k, v in hf.items()}


def llama_config(cfg: ModelConfig, token_ids: Dict[str, Optional[int]]):
    """The LlamaConfig of this model; HF's vocab_size is the embedding's (padded) row count."""
    from transformers import LlamaConfig  # interop-only dependency

    check_llama_compatible(cfg)
    return LlamaConfig(
        architectures=["LlamaForCausalLM"],
        vocab_size=cfg.padded_vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.resolved_intermediate_size,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.resolved_n_kv_heads,
        head_dim=cfg.head_dim,
        hidden_act="silu",
        max_position_embeddings=cfg.max_seq_len,
        initializer_range=cfg.init_std,
        rms_norm_eps=cfg.norm_eps,
        tie_word_embeddings=cfg.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=token_ids.get("bos"),
        eos_token_id=token_ids.get("eos"),
        pad_token_id=token_ids.get("pad"),
        **{MINILLAMA_CONFIG_KEY: dataclasses.asdict(cfg)},
    )


def as_standard(cfg: ModelConfig, state: Dict[str, torch.Tensor]):
    """An sp config and state dict with the same logits as this mup model (LlamaForCausalLM has neither knob): the
    attention scale folded into q_proj (q·k is linear in q; RoPE commutes with scaling it), the output multiplier
    into an untied lm_head (a tied one is the embedding, which must stay). An sp model comes back unchanged."""
    if cfg.parametrization == "sp":
        return cfg, state
    q_factor = 1.0 if cfg.attention_scale is None else cfg.attention_scale * math.sqrt(cfg.head_dim)
    folded = {k: v * q_factor if k.endswith("attn.q_proj.weight") else v for k, v in state.items()}
    folded["lm_head.weight"] = state["lm_head.weight"] * cfg.output_multiplier
    return dataclasses.replace(cfg, parametrization="sp", tie_embeddings=False), folded


def export_checkpoint(checkpoint: str, out_dir: str, force: bool = False, verify: bool = True) -> Path:
    """Write `out_dir` for AutoModelForCausalLM / AutoTokenizer.from_pretrained, assembled aside and renamed into
    place; with a manifest.json of its own only when the checkpoint was verified (never vouching for unchecked
    weights). `force` replaces an existing non-empty `out_dir`."""
    ckpt = resolve_checkpoint(checkpoint)
    check_llama_compatible(load_model_config(ckpt))  # before reading any weights
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise FileExistsError(f"{out} exists and is not empty; pass --force to replace it")
    model, tokenizer, _ = load_model(str(ckpt), verify=verify)  # checks files, config, weights and tokenizer
    tmp = out.with_name(f".{out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_hf_dir(tmp, model, tokenizer, read_special_tokens(ckpt), ckpt / TOKENIZER)
        if verify:
            write_manifest(tmp)
        else:
            print(
                f"warning: {out} gets no {MANIFEST}: {ckpt} was not verified against its own (--no-verify), so "
                "nothing vouches for these weights",
                file=sys.stderr,
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    tmp.rename(out)
    return out


def write_hf_dir(
    out: Path, model: Transformer, tokenizer, roles: Dict[str, Optional[str]], tokenizer_file: Path
) -> None:
    """config.json, model.safetensors, generation_config.json, tokenizer.json + tokenizer_config.json; a padded
    vocabulary's rows counted in vocab_size (as GPT-2-style checkpoints), a mup model as its sp equivalent."""
    from transformers import GenerationConfig, PreTrainedTokenizerFast  # interop-only dependency

    cfg, state = as_standard(model.cfg, model.state_dict())  # LlamaForCausalLM has no μP knobs
    ids = token_ids(tokenizer, roles)
    llama_config(cfg, ids).save_pretrained(out)
    tensors = to_hf_state_dict(state, cfg)  # contiguous, as safetensors needs
    write_file(out / "model.safetensors", save_safetensors(tensors, metadata={"format": "pt"}))
    # The padding ids (no token has them) are suppressed in HF's generate() too, as in ours.
    n_tokens = min(cfg.vocab_size, tokenizer.get_vocab_size())
    padding = list(range(n_tokens, cfg.padded_vocab_size))
    GenerationConfig(
        bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"], suppress_tokens=padding or None
    ).save_pretrained(out)
    # Wrapping our tokenizer as-is keeps encoding identical; model_max_length lets HF warn about
    # over-long inputs instead of silently running past the trained context.
    specials = {f"{role}_token": token for role, token in roles.items() if token is not None}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=cfg.max_seq_len, **specials).save_pretrained(
        out
    )
    # save_pretrained re-serialises tokenizer.json with an equivalent no-op post-processor; ship the
    # original bytes so that export → import gives back the very same file.
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
