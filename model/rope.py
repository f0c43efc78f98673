"""Rotary position embeddings (RoPE): precomputed cos/sin tables and their application to q and k."""
from typing import Tuple

import torch


def rope_tables(head_dim: int, max_seq_len: int, theta: float = 10000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables of shape (max_seq_len, head_dim), computed once in fp32.

    Layout is "rotate half" (GPT-NeoX / Hugging Face Llama): dimension i is paired with
    i + head_dim/2, so the table repeats the frequencies twice. Using HF's layout means weights
    export to `LlamaForCausalLM` without permuting q/k.
    """
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    positions = torch.arange(max_seq_len, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)  # (T, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim)
    # float64 for the angles: position·frequency reaches ~1e4 rad, where fp32 loses digits.
    return angles.cos().float(), angles.sin().float()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x of shape (B, T, n_heads, head_dim) by the tables' rows for its T positions.

    The tables are cast to x's dtype: under bf16 autocast x is bf16, and upcasting the whole
    q/k tensors to fp32 here costs ~8 % of a training step for no measurable gain.
    """
    cos = cos.to(x.dtype)[None, :, None, :]  # (1, T, 1, head_dim)
    sin = sin.to(x.dtype)[None, :, None, :]
    return x * cos + rotate_half(x) * sin
