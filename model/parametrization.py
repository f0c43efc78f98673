"""How weights, the attention scores and the logits scale with width: the standard parametrization (sp)
or the Maximal Update Parametrization (mup, Yang et al. 2022). docs/mup.md derives each rule.

Under mup, m = hidden_size / mup_base_width is the width multiplier; at m = 1 both parametrizations
are the same network. These are the model's half of μP (init, multipliers); the optimizer's half
(per-parameter learning rates) is in training/optim/lr_scale.py.
"""
import dataclasses
import math
from typing import Dict, Optional, Tuple

import torch

PARAMETRIZATIONS = ("sp", "mup")


def width_multiplier(cfg) -> float:
    """m = hidden_size / mup_base_width under mup; 1 under sp (nothing scales)."""
    return cfg.hidden_size / cfg.mup_base_width if cfg.parametrization == "mup" else 1.0


def describe(cfg) -> str:
    """'sp', or 'mup (m = 4 over base width 64)': what the run header and the model summary print."""
    if cfg.parametrization == "sp":
        return "sp"
    return f"mup (m = {width_multiplier(cfg):g} over base width {cfg.mup_base_width})"


def hidden_init_scale(cfg) -> float:
    """× init std of the matrices inside the blocks: 1/sqrt(m), so their variance stays ∝ 1/fan_in
    relative to the base width (Table 3's "hidden weights: 1/fan_in")."""
    return 1.0 / math.sqrt(width_multiplier(cfg))


def output_multiplier(cfg) -> Optional[float]:
    """What the LM head's input is multiplied by: 1/m under mup (the mup package's MuReadout), None
    under sp (no multiplication at all, so sp stays bitwise what it was). On the input, not on the
    weight: a tied head shares its weight with the embedding, which must not be scaled."""
    return 1.0 / width_multiplier(cfg) if cfg.parametrization == "mup" else None


def base_head_dim(cfg) -> float:
    """head_dim at the base width, assuming n_heads stays fixed as the model widens (head_dim ∝ width)."""
    return cfg.head_dim / width_multiplier(cfg)


def attention_scale(cfg) -> Optional[float]:
    """The softmax temperature of q·k: sqrt(base_head_dim)/head_dim under mup (1/head_dim in width, equal
    to SDPA's default 1/sqrt(head_dim) at the base width); None under sp (SDPA's default), and under mup
    with model.mup_attention_scale=sp (an arm of docs/mup.md's AdamW experiment)."""
    mup = cfg.parametrization == "mup" and cfg.mup_attention_scale == "mup"
    return math.sqrt(base_head_dim(cfg)) / cfg.head_dim if mup else None


def as_standard(cfg, state: Dict[str, torch.Tensor]) -> Tuple[object, Dict[str, torch.Tensor]]:
    """An sp config and state dict computing the same logits as this (mup) model: the attention scale
    folded into q_proj (q·k is linear in q; RoPE rotates q, which commutes with scaling it) and the
    output multiplier into an untied lm_head (a tied one is the embedding, which must stay as it is).
    An sp model comes back unchanged. Used by the Hugging Face export: LlamaForCausalLM has neither knob."""
    if cfg.parametrization == "sp":
        return cfg, state
    scale = attention_scale(cfg)
    q_factor = 1.0 if scale is None else scale * math.sqrt(cfg.head_dim)  # mup's scale / sp's 1/sqrt(head_dim)
    folded = dict(state)
    for name, tensor in state.items():
        if name.endswith("attn.q_proj.weight"):
            folded[name] = tensor * q_factor
    folded["lm_head.weight"] = state["lm_head.weight"] * output_multiplier(cfg)
    return dataclasses.replace(cfg, parametrization="sp", tie_embeddings=False), folded
