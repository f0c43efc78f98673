"""The pre-norm decoder block and the full LLaMA-style Transformer, with its init and accounting."""
import math
from typing import Dict, Optional

import torch
from torch import nn

from model.attention import Attention
from model.config import ModelConfig
from model.kv_cache import KVCache
from model.mlp import MLPS
from model.norm import NORMS
from model.rope import rope_tables


class Block(nn.Module):
    """x = x + attn(norm(x)); x = x + mlp(norm(x)) — pre-norm keeps the residual path an identity."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        norm_cls, mlp_cls = NORMS[cfg.norm], MLPS[cfg.mlp]
        self.attn_norm = norm_cls(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = norm_cls(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = mlp_cls(cfg.hidden_size, cfg.intermediate_size, dropout=cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        x = x + self.resid_dropout(self.attn(self.attn_norm(x), cos, sin, cache))  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Token embedding → N blocks → final norm → LM head. `forward` returns logits; no loss here."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = NORMS[cfg.norm](cfg.hidden_size, eps=cfg.norm_eps)
        # With tie_embeddings the head reuses the embedding matrix (tied in init_weights).
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        # Tables are derived from the config, so keep them out of the state dict (persistent=False).
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, init_std) for every matrix; residual output projections scaled by 1/sqrt(2·n_layers).

        Each block adds two outputs (attention, MLP) to the residual stream, so its variance grows
        with depth; shrinking o_proj/down_proj keeps the stream's scale independent of n_layers
        (GPT-2 / nanoGPT). Norm weights stay at ones, LayerNorm biases at zero; RoPE tables recomputed.
        """
        if self.cfg.tie_embeddings:  # (re-)tie: to_empty() gives the two modules separate tensors
            self.lm_head.weight = self.embed_tokens.weight
        # The RoPE tables too: a model built on the meta device and materialised with to_empty()
        # (large-model / FSDP init) gets them here, not from __init__.
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
        std = self.cfg.init_std
        residual_std = std / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                is_residual_out = name.endswith("attn.o_proj") or name.endswith("mlp.down_proj")
                nn.init.normal_(module.weight, mean=0.0, std=residual_std if is_residual_out else std)
        for module in self.modules():
            if isinstance(module, tuple(NORMS.values())):
                nn.init.ones_(module.weight)
                if getattr(module, "bias", None) is not None:
                    nn.init.zeros_(module.bias)

    def forward(self, input_ids: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """input_ids (B, T) → logits (B, T, vocab_size). With a cache, positions continue after it."""
        B, T = input_ids.shape
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {start + T} tokens exceeds model.max_seq_len={self.cfg.max_seq_len}; "
                             "shorten the input or train with a larger max_seq_len")
        cos, sin = self.rope_cos[start:start + T], self.rope_sin[start:start + T]  # (T, head_dim)
        x = self.embed_tokens(input_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, cos, sin, cache)
        if cache is not None:
            cache.advance(T)
        return self.lm_head(self.norm(x))  # (B, T, vocab_size)

    def new_kv_cache(self, batch_size: int, max_seq_len: Optional[int] = None,
                     dtype: Optional[torch.dtype] = None) -> KVCache:
        cfg, ref = self.cfg, self.embed_tokens.weight
        return KVCache(cfg.n_layers, batch_size, max_seq_len or cfg.max_seq_len, cfg.n_kv_heads, cfg.head_dim,
                       dtype=dtype or ref.dtype, device=ref.device)

    def param_counts(self) -> Dict[str, int]:
        """Parameters by kind. A tied LM head shares the embedding and is not counted twice."""
        counts = {"embedding": self.embed_tokens.weight.numel(), "attention": 0, "mlp": 0, "norm": 0,
                  "lm_head": 0 if self.cfg.tie_embeddings else self.lm_head.weight.numel()}
        for block in self.layers:
            counts["attention"] += sum(p.numel() for p in block.attn.parameters())
            counts["mlp"] += sum(p.numel() for p in block.mlp.parameters())
            counts["norm"] += sum(p.numel() for m in (block.attn_norm, block.mlp_norm) for p in m.parameters())
        counts["norm"] += sum(p.numel() for p in self.norm.parameters())
        counts["total"] = sum(p.numel() for p in self.parameters())  # parameters() dedupes tied weights
        return counts

    def flops_per_token(self, seq_len: Optional[int] = None) -> float:
        """Training FLOPs per token: 6·N_matmul + 12·n_layers·hidden·seq_len (PaLM appendix B).

        N_matmul counts the weights a token is multiplied by: attention, MLP and the LM head (even
        when tied — the head's matmul still runs); the embedding lookup is free. 6 = 2 (multiply-add)
        × 3 (forward + two backward matmuls). The second term is QKᵀ and attention·V, not weights.
        """
        c, cfg = self.param_counts(), self.cfg
        n_matmul = c["attention"] + c["mlp"] + cfg.vocab_size * cfg.hidden_size
        return 6 * n_matmul + 12 * cfg.n_layers * cfg.hidden_size * (seq_len or cfg.max_seq_len)
