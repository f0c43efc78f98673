"""Shared bits for the model tests: a tiny GQA config, weights that are not at their init, one CPU thread,
and the LLaMA forward pass written out in float64 from the config's numbers (the reference)."""

import contextlib
import math
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

from model import ModelConfig, RMSNorm, Transformer
from model.attention import Attention


def tiny_model_config(**overrides) -> ModelConfig:
    """2 layers, dim 32, 4 query heads sharing 2 kv heads: small enough for milliseconds, GQA on purpose."""
    fields = dict(vocab_size=61, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=24)
    return ModelConfig(**{**fields, **overrides})


def random_transformer(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Init weights plus noise on every parameter, norm weights included, so a swapped or ignored
    parameter cannot hide behind ones, zeros or the tiny residual init."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread; with other jobs on the two cores, OpenMP's spinning
    threads make them 10× slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# ---- float64 references: every constant comes from the config, never from a module's attribute ------


def reference_rope(head_dim: int, seq_len: int, theta: float) -> tuple:
    """cos, sin (seq_len, head_dim) in float64, rotate-half layout: pair (i, i + head_dim/2) turns by
    position · theta^(-2i/head_dim)."""
    inv_freq = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.arange(seq_len, dtype=torch.float64)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def reference_rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight.double()


def reference_attention(
    attn: Attention,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    eps: float = 1e-5,
    scale: Optional[float] = None,
) -> torch.Tensor:
    """Causal attention written out in float64: explicit scores, -inf mask, softmax, kv heads repeated.
    `eps` is the QK-norm's (model.norm_eps); `scale` multiplies q·k (default 1/sqrt(head_dim))."""
    B, T, _ = x.shape
    H, KV, hd = attn.n_heads, attn.n_kv_heads, attn.head_dim
    x, cos, sin = x.double(), cos.double()[:, None, :], sin.double()[:, None, :]  # (T, 1, hd) vs (B, T, H, hd)
    q = (x @ attn.q_proj.weight.double().T).view(B, T, H, hd)
    k = (x @ attn.k_proj.weight.double().T).view(B, T, KV, hd)
    v = (x @ attn.v_proj.weight.double().T).view(B, T, KV, hd)
    if isinstance(attn.q_norm, RMSNorm):  # QK-norm: RMS over each head's head_dim, then the shared weight
        q, k = reference_rms(q, attn.q_norm.weight, eps), reference_rms(k, attn.k_norm.weight, eps)

    def rotate(t):  # the rotation, pair (i, i + hd/2) at angle cos/sin
        t1, t2 = t[..., : hd // 2], t[..., hd // 2 :]
        return t * cos + torch.cat([-t2, t1], dim=-1) * sin

    q, k = rotate(q), rotate(k)
    # Query head h reads kv head h // (H/KV): repeat each kv head H/KV times, in order.
    k, v = k.repeat_interleave(H // KV, dim=2), v.repeat_interleave(H // KV, dim=2)
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * (1 / math.sqrt(hd) if scale is None else scale)
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    out = torch.einsum("bhqk,bkhd->bqhd", weights, v).reshape(B, T, H * hd)
    return out @ attn.o_proj.weight.double().T


def reference_forward(model: Transformer, ids: torch.Tensor) -> torch.Tensor:
    """LLaMA's forward pass (RMSNorm, SwiGLU) in float64: embedding, pre-norm blocks with residual
    additions, final norm, LM head. eps and theta are read from model.cfg, nowhere else. Under μP
    (docs/mup.md) q·k is scaled by sqrt(base head_dim)/head_dim with base head_dim = mup_base_width /
    n_heads (1/sqrt(head_dim) with mup_attention_scale=sp), and the head's input by mup_base_width / hidden_size."""
    cfg = model.cfg
    assert cfg.norm == "rmsnorm" and cfg.mlp == "swiglu", "the reference is LLaMA's recipe only"
    mup = cfg.parametrization == "mup"
    mup_scale = mup and cfg.mup_attention_scale == "mup"
    scale = math.sqrt(cfg.mup_base_width / cfg.n_heads) / cfg.head_dim if mup_scale else None
    output_multiplier = cfg.mup_base_width / cfg.hidden_size if mup else 1.0
    cos, sin = reference_rope(cfg.head_dim, ids.shape[1], cfg.rope_theta)
    x = model.embed_tokens.weight.double()[ids]  # (B, T, D)
    for block in model.layers:
        h = reference_rms(x, block.attn_norm.weight, cfg.norm_eps)
        x = x + reference_attention(block.attn, h, cos, sin, cfg.norm_eps, scale)
        h = reference_rms(x, block.mlp_norm.weight, cfg.norm_eps)
        gate, up = (h @ block.mlp.gate_up_proj.weight.double().T).chunk(2, dim=-1)
        x = x + (F.silu(gate) * up) @ block.mlp.down_proj.weight.double().T
    x = reference_rms(x, model.norm.weight, cfg.norm_eps) * output_multiplier
    return x @ model.lm_head.weight.double().T
