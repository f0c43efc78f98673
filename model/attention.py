"""Causal self-attention: RoPE, grouped-query heads, optional QK-norm, SDPA, and the KV cache generation uses."""

from typing import Callable, List, Optional, Tuple

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.norm import NoNorm, RMSNorm


def rope_tables(head_dim: int, max_seq_len: int, theta: float = 10000.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables (max_seq_len, head_dim) in the "rotate half" layout (GPT-NeoX, HF Llama: dimension i pairs
    with i + head_dim/2), so weights export to LlamaForCausalLM without permuting q/k."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    angles = torch.outer(torch.arange(max_seq_len, dtype=torch.float64), inv_freq)  # (T, head_dim/2)
    angles = torch.cat([angles, angles], dim=-1)  # (T, head_dim)
    return angles.cos().float(), angles.sin().float()  # float64 angles: position·frequency reaches ~1e4 rad


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x (B, T, heads, head_dim) by the tables' rows for its T positions, in x's dtype (upcasting q and k
    under bf16 autocast cost ~8 % of a step for no measurable gain)."""
    cos, sin = cos.to(x.dtype)[None, :, None, :], sin.to(x.dtype)[None, :, None, :]  # (1, T, 1, head_dim)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class KVCache:
    """Per-layer (B, n_kv_heads, max_seq_len, head_dim) keys and values, and how many positions are filled. Sized
    for the kv heads, not the query heads: with GQA the cache is n_heads / n_kv_heads times smaller."""

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        max_seq_len: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype = torch.float32,
        device="cpu",
    ):
        shape = (batch_size, n_kv_heads, max_seq_len, head_dim)
        self.keys: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_seq_len, self.length = max_seq_len, 0  # length: the next token's position

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv_heads, T, head_dim) at positions [length, length+T); return all filled ones."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_seq_len:
            raise ValueError(f"KV cache overflow: {end} positions > max_seq_len={self.max_seq_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        """Once per forward pass, after every layer wrote its n new positions."""
        self.length += n

    def reset(self) -> None:
        self.length = 0


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.resolved_n_kv_heads, cfg.head_dim
        # Separate q/k/v projections without biases, as LLaMA: the HF weight names map one to one.
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        # QK-norm: RMSNorm over head_dim, one weight for all heads, so logits cannot grow without bound.
        self.q_norm = (RMSNorm if cfg.qk_norm else NoNorm)(self.head_dim, eps=cfg.norm_eps)
        self.k_norm = (RMSNorm if cfg.qk_norm else NoNorm)(self.head_dim, eps=cfg.norm_eps)
        self.dropout, self.scale, self.zero_query = cfg.dropout, cfg.attention_scale, cfg.zero_query_init
        # Wrapped here, not at import: torch.compiler.disable imports dynamo, ~2 s of every program's start-up
        self.sdpa_with_dropout = torch.compiler.disable(_sdpa_outside_compile) if cfg.dropout else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Optional[KVCache] = None
    ) -> torch.Tensor:
        """x (B, T, D); cos/sin (T, head_dim) rows for these T positions; the cache holds the earlier ones."""
        B, T, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.n_heads, self.head_dim))  # QK-norm before RoPE, as Qwen3
        k = self.k_norm(self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim))
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in (apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))  # (B, h, T, hd)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(self.layer_idx, k, v)  # (B, n_kv_heads, past + T, head_dim)
        dropout_p = self.dropout if self.training else 0.0
        sdpa = self.sdpa_with_dropout if dropout_p and x.device.type == "cpu" else F.scaled_dot_product_attention
        out = sdpa(
            q,
            k,
            v,
            attn_mask=_causal_mask(T, past, x.device),
            is_causal=past == 0 and T > 1,
            dropout_p=dropout_p,
            enable_gqa=self.n_kv_heads != self.n_heads,
            scale=self.scale,
        )
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def init_weights(self, std: float, out_std: float) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=std)
        if self.zero_query:  # every score 0 at init, attention uniform (μP's TP5, D.2); after k and v's draws
            nn.init.zeros_(self.q_proj.weight)
        nn.init.normal_(self.o_proj.weight, mean=0.0, std=out_std)  # writes into the residual stream
        self.q_norm.init_weights(std, out_std)
        self.k_norm.init_weights(std, out_std)


def _sdpa_outside_compile(*args, **kwargs) -> torch.Tensor:
    """SDPA with attention dropout, eager even in a compiled model (torch.compiler.disable, in Attention): torch 2.13's
    inductor turns its CPU backward under bf16 autocast into NaN gradients for q and k. One graph break per layer."""
    return F.scaled_dot_product_attention(*args, **kwargs)


def _causal_mask(T: int, past: int, device: torch.device) -> Optional[torch.Tensor]:
    """None where SDPA's own masking is right (no cache, or one new token); else the bottom-right-aligned
    (T, past + T) mask, since is_causal would align the triangle top-left and hide cached keys."""
    if past == 0 or T == 1:
        return None
    return torch.arange(past + T, device=device)[None, :] <= torch.arange(past, past + T, device=device)[:, None]


def attention_logits(
    attn: Attention, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> torch.Tensor:
    """The causal entries of q·kᵀ × scale as forward computes them, flat (q, k (B, T, heads, hd) as the norms leave
    them): what μP's attention scale keeps Θ(1) as width grows (docs/mup.md)."""
    q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)  # (B, H, T, hd)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # grouped-query heads share k
    logits = (q @ k.transpose(-2, -1)) * (attn.scale if attn.scale is not None else attn.head_dim**-0.5)
    T = logits.shape[-1]
    return logits[..., torch.ones(T, T, dtype=torch.bool, device=logits.device).tril()].flatten()


def hook_attention_logits(attn: Attention, record: Callable[[torch.Tensor], None], rows: Optional[int] = None) -> list:
    """Forward hooks that pass `record` each forward's attention logits (of its first `rows` sequences); the caller
    removes the returned handles. Uncompiled module, no cache."""
    seen = {}
    return [
        attn.q_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out[:rows])),
        attn.k_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out[:rows])),
        attn.register_forward_hook(lambda m, a, out: record(attention_logits(m, seen["q"], seen["k"], a[1], a[2]))),
    ]
