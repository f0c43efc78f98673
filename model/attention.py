"""Causal self-attention with RoPE, grouped-query heads, optional QK-norm, SDPA, and a KV cache."""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.kv_cache import KVCache
from model.norm import NoNorm, RMSNorm
from model.parametrization import attention_scale
from model.rope import apply_rope


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.resolved_n_kv_heads, cfg.head_dim
        # Separate q/k/v projections (no biases, as LLaMA) keep the HF weight names one-to-one.
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        # QK-norm (OLMo-2, Qwen3): RMSNorm over each head's head_dim, one weight shared by all heads,
        # so attention logits cannot grow without bound as q and k weights grow. Always RMSNorm:
        # the model.norm ablation is about the residual-stream norms.
        norm_cls = RMSNorm if cfg.qk_norm else NoNorm
        self.q_norm = norm_cls(self.head_dim, eps=cfg.norm_eps)
        self.k_norm = norm_cls(self.head_dim, eps=cfg.norm_eps)
        self.dropout = cfg.dropout
        # None: SDPA's 1/sqrt(head_dim) (sp). mup: ∝ 1/head_dim, as q and k grow correlated with width.
        self.scale = attention_scale(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        """x (B, T, D); cos/sin (T, head_dim) rows for these T positions; cache holds earlier ones."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)  # identity unless qk_norm; before RoPE, as Qwen3
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, head_dim)

        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(self.layer_idx, k, v)  # (B, n_kv_heads, past + T, head_dim)
        dropout_p = self.dropout if self.training else 0.0
        sdpa = _sdpa_outside_compile if dropout_p and x.device.type == "cpu" else F.scaled_dot_product_attention
        out = sdpa(
            q, k, v,
            attn_mask=_causal_mask(T, past, x.device),
            is_causal=past == 0 and T > 1,
            dropout_p=dropout_p,
            # Each group of n_heads/n_kv_heads query heads shares one k/v head.
            enable_gqa=self.n_kv_heads != self.n_heads,
            scale=self.scale,
        )  # (B, n_heads, T, head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def init_weights(self, std: float, out_std: float) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=std)
        nn.init.normal_(self.o_proj.weight, mean=0.0, std=out_std)  # writes into the residual stream
        self.q_norm.init_weights(std, out_std)
        self.k_norm.init_weights(std, out_std)


@torch.compiler.disable
def _sdpa_outside_compile(*args, **kwargs) -> torch.Tensor:
    """SDPA with attention dropout, run eagerly even in a compiled model. torch 2.13's inductor on CPU turns
    its backward under bf16 autocast into NaN gradients for q and k (tests/test_attention.py reproduces it);
    eager SDPA is exact. One graph break per layer, only when training with dropout on a CPU."""
    return F.scaled_dot_product_attention(*args, **kwargs)


def _causal_mask(T: int, past: int, device: torch.device) -> Optional[torch.Tensor]:
    """None when SDPA's own masking is right: no cache (is_causal) or one new token (sees all).

    For T > 1 new tokens after `past` cached ones, SDPA's is_causal would align the triangle to
    the top-left and hide cached keys, so build the bottom-right-aligned mask explicitly.
    """
    if past == 0 or T == 1:
        return None
    q_pos = torch.arange(past, past + T, device=device)[:, None]
    k_pos = torch.arange(past + T, device=device)[None, :]
    return k_pos <= q_pos  # (T, past + T), True = may attend
