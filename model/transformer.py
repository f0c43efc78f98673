"""The pre-norm decoder block and the LLaMA-style Transformer: its init, μP's multipliers, and its accounting."""

import math
from typing import Dict, Optional, Tuple

import torch
from torch import nn

from model.attention import Attention, KVCache, rope_tables
from model.config import ModelConfig
from model.mlp import MLPS
from model.norm import NORMS


class Block(nn.Module):
    """x = x + attn(norm(x)); x = x + mlp(norm(x)) — pre-norm keeps the residual path an identity."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.attn_norm = NORMS[cfg.norm](cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = NORMS[cfg.norm](cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = MLPS[cfg.mlp](cfg.hidden_size, cfg.resolved_intermediate_size, dropout=cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: Optional[KVCache] = None
    ) -> torch.Tensor:
        x = x + self.resid_dropout(self.attn(self.attn_norm(x), cos, sin, cache))  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))

    def init_weights(self, std: float, out_std: float) -> None:
        """Each part initialises itself, giving out_std to its layers that write into the residual stream."""
        for name, part in self.named_children():
            if hasattr(part, "init_weights"):
                part.init_weights(std, out_std)
            elif any(True for _ in part.parameters()):  # a new part must not silently keep torch's init
                raise TypeError(
                    f"{type(part).__name__} (block part {name!r}) has parameters but no "
                    "init_weights(std, out_std); add one (docs/architecture.md, 'add an MLP')"
                )


class Transformer(nn.Module):
    """Token embedding → N blocks → final norm → LM head. `forward` returns logits; the loss is the caller's."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = NORMS[cfg.norm](cfg.hidden_size, eps=cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)  # tied in init_weights
        self.output_multiplier = cfg.output_multiplier  # None (sp), or mup's 1/m on the head's input
        # Derived from the config, so kept out of the state dict.
        self.register_buffer("rope_cos", torch.empty(cfg.max_seq_len, cfg.head_dim), persistent=False)
        self.register_buffer("rope_sin", torch.empty(cfg.max_seq_len, cfg.head_dim), persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, init_std) for every matrix; the layers writing into the residual stream get /sqrt(2·n_layers)
        (GPT-2), so its scale does not grow with depth; norms are the identity; under mup the blocks' matrices get
        × 1/sqrt(m). Also the entry after a meta-device build and to_empty(): it re-ties the head, refills RoPE."""
        cfg = self.cfg
        if cfg.tie_embeddings:  # (re-)tie: to_empty() gives the two modules separate tensors
            self.lm_head.weight = self.embed_tokens.weight
        with torch.no_grad():
            for buffer, table in zip(
                (self.rope_cos, self.rope_sin), rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
            ):
                buffer.copy_(table)
        nn.init.normal_(self.embed_tokens.weight, mean=0.0, std=cfg.init_std)
        if not cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=cfg.init_std)
        block_std = cfg.init_std * cfg.hidden_init_scale  # × 1.0 under sp: the very same floats
        for layer in self.layers:
            layer.init_weights(block_std, block_std / math.sqrt(2 * cfg.n_layers))
        self.norm.init_weights(cfg.init_std, cfg.init_std)

    def hidden_states(self, input_ids: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """input_ids (B, T) → final-normed hidden states (B, T, D); with a cache, positions continue after it."""
        B, T = input_ids.shape
        start = cache.length if cache is not None else 0
        if start + T > self.cfg.max_seq_len:
            raise ValueError(
                f"sequence of {start + T} tokens exceeds model.max_seq_len={self.cfg.max_seq_len}; "
                "shorten the input or train with a larger max_seq_len"
            )
        cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]  # (T, head_dim)
        x = self.embed_tokens(input_ids)  # (B, T, D)
        for layer in self.layers:
            x = layer(x, cos, sin, cache)
        if cache is not None:
            cache.advance(T)
        return self.norm(x)

    def lm_head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden × mup's 1/m (itself under sp): every path to logits goes through here, the losses' too."""
        return hidden if self.output_multiplier is None else hidden * self.output_multiplier

    def forward(self, input_ids: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """input_ids (B, T) → logits (B, T, padded_vocab_size)."""
        return self.lm_head(self.lm_head_input(self.hidden_states(input_ids, cache)))

    def new_kv_cache(self, batch_size: int, max_seq_len: Optional[int] = None, dtype=None) -> KVCache:
        cfg, ref = self.cfg, self.embed_tokens.weight
        return KVCache(
            cfg.n_layers,
            batch_size,
            max_seq_len or cfg.max_seq_len,
            cfg.resolved_n_kv_heads,
            cfg.head_dim,
            dtype=dtype or ref.dtype,
            device=ref.device,
        )

    def param_counts(self) -> Dict[str, int]:
        """Parameters by kind; every norm (QK-norm included) counts as norm; a tied head is not counted twice."""
        params = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
        norms = lambda m: sum(params(n) for n in m.modules() if isinstance(n, tuple(NORMS.values())))  # noqa: E731
        counts = {
            "embedding": self.embed_tokens.weight.numel(),
            "attention": 0,
            "mlp": 0,
            "norm": norms(self),
            "lm_head": 0 if self.cfg.tie_embeddings else self.lm_head.weight.numel(),
        }
        for block in self.layers:
            counts["attention"] += params(block.attn) - norms(block.attn)
            counts["mlp"] += params(block.mlp)
        counts["total"] = params(self)  # parameters() dedupes tied weights
        return counts

    def token_flops(self, seq_len: Optional[int] = None) -> Tuple[int, int]:
        """(weights, attention) training FLOPs per token on seq_len windows, the MFU numerator: 6 per matmul weight
        (2 forward, 4 backward; the LM head's even when tied, padded rows included; the embedding is a lookup), and
        causal attention — query i scores keys 0..i, T(T+1)/2 pairs a head, 4·head_dim FLOPs each forward, ×3 with
        backward: half of PaLM's 12·L·d·T, which counts the masked half. FlashAttention's recomputation is not work."""
        cfg, seq_len = self.cfg, seq_len or self.cfg.max_seq_len
        weights = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return 6 * weights, cfg.n_layers * cfg.n_heads * cfg.head_dim * 6 * (seq_len + 1)

    def flops_per_token(self, seq_len: Optional[int] = None) -> float:
        return float(sum(self.token_flops(seq_len)))
