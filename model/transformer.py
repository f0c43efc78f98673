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
from model.parametrization import hidden_init_scale, output_multiplier
from model.rope import rope_tables


class Block(nn.Module):
    """x = x + attn(norm(x)); x = x + mlp(norm(x)) — pre-norm keeps the residual path an identity."""

    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        norm_cls, mlp_cls = NORMS[cfg.norm], MLPS[cfg.mlp]
        self.attn_norm = norm_cls(cfg.hidden_size, eps=cfg.norm_eps)
        self.attn = Attention(cfg, layer_idx)
        self.mlp_norm = norm_cls(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = mlp_cls(cfg.hidden_size, cfg.resolved_intermediate_size, dropout=cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        x = x + self.resid_dropout(self.attn(self.attn_norm(x), cos, sin, cache))  # (B, T, D)
        return x + self.mlp(self.mlp_norm(x))

    def init_weights(self, std: float, out_std: float) -> None:
        """Each part initialises itself; it gives out_std to its layers that write into the residual stream."""
        for name, part in self.named_children():
            init = getattr(part, "init_weights", None)
            if init is not None:
                init(std, out_std)
            elif any(True for _ in part.parameters()):  # a new part must not silently keep torch's init
                raise TypeError(f"{type(part).__name__} (block part {name!r}) has parameters but no "
                                "init_weights(std, out_std); add one (docs/architecture.md, 'add an MLP')")


class Transformer(nn.Module):
    """Token embedding → N blocks → final norm → LM head. `forward` returns logits; no loss here."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # padded_vocab_size rows: the ids above vocab_size are padding that no token uses.
        self.embed_tokens = nn.Embedding(cfg.padded_vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = NORMS[cfg.norm](cfg.hidden_size, eps=cfg.norm_eps)
        # With tie_embeddings the head reuses the embedding matrix (tied in init_weights).
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.padded_vocab_size, bias=False)
        self.output_multiplier = output_multiplier(cfg)  # None (sp), or mup's 1/m on the head's input
        # Tables are derived from the config, so keep them out of the state dict (persistent=False).
        cos, sin = rope_tables(cfg.head_dim, cfg.max_seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.init_weights()

    def init_weights(self) -> None:
        """Normal(0, init_std) for every matrix; residual output projections get init_std/sqrt(2·n_layers).

        Each block adds two outputs (attention, MLP) to the residual stream, so its variance grows
        with depth; shrinking the layers that write into it keeps the stream's scale independent of
        n_layers (GPT-2 / nanoGPT). Which layers those are, each block part says in its own
        init_weights(std, out_std); norms reset to the identity. Under mup the blocks' matrices get
        ×1/sqrt(m) (variance ∝ 1/fan_in); embedding and head keep init_std at every width. Also the
        entry point after a meta-device build and to_empty(): it re-ties the head and recomputes the
        RoPE tables.
        """
        if self.cfg.tie_embeddings:  # (re-)tie: to_empty() gives the two modules separate tensors
            self.lm_head.weight = self.embed_tokens.weight
        cos, sin = rope_tables(self.cfg.head_dim, self.cfg.max_seq_len, self.cfg.rope_theta)
        with torch.no_grad():
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)
        std = self.cfg.init_std
        nn.init.normal_(self.embed_tokens.weight, mean=0.0, std=std)
        if not self.cfg.tie_embeddings:
            nn.init.normal_(self.lm_head.weight, mean=0.0, std=std)
        block_std = std * hidden_init_scale(self.cfg)  # × 1.0 under sp: the very same floats
        out_std = block_std / math.sqrt(2 * self.cfg.n_layers)
        for layer in self.layers:
            layer.init_weights(block_std, out_std)
        self.norm.init_weights(std, out_std)

    def hidden_states(self, input_ids: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """input_ids (B, T) → final-normed hidden states (B, T, D), the LM head's input.

        For losses that apply the head themselves (e.g. chunked cross-entropy that never holds
        the full fp32 logits). With a cache, positions continue after it.
        """
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
        return self.norm(x)  # (B, T, D)

    def lm_head_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden_states' output → what lm_head multiplies: itself under sp, × 1/m under mup. Every path
        to logits goes through here (forward, hence generation; the losses in training/loss.py)."""
        return hidden if self.output_multiplier is None else hidden * self.output_multiplier

    def forward(self, input_ids: torch.Tensor, cache: Optional[KVCache] = None) -> torch.Tensor:
        """input_ids (B, T) → logits (B, T, padded_vocab_size). With a cache, positions continue after it."""
        return self.lm_head(self.lm_head_input(self.hidden_states(input_ids, cache)))

    def new_kv_cache(self, batch_size: int, max_seq_len: Optional[int] = None,
                     dtype: Optional[torch.dtype] = None) -> KVCache:
        cfg, ref = self.cfg, self.embed_tokens.weight
        return KVCache(cfg.n_layers, batch_size, max_seq_len or cfg.max_seq_len, cfg.resolved_n_kv_heads, cfg.head_dim,
                       dtype=dtype or ref.dtype, device=ref.device)

    def param_counts(self) -> Dict[str, int]:
        """Parameters by kind; every norm (QK-norm included) counts as norm, wherever it sits.
        A tied LM head shares the embedding and is not counted twice."""
        counts = {"embedding": self.embed_tokens.weight.numel(), "attention": 0, "mlp": 0, "norm": 0,
                  "lm_head": 0 if self.cfg.tie_embeddings else self.lm_head.weight.numel()}
        for block in self.layers:
            attn_norms = _norm_params(block.attn)
            counts["attention"] += _params(block.attn) - attn_norms
            counts["mlp"] += _params(block.mlp)
            counts["norm"] += attn_norms + _norm_params(block.attn_norm) + _norm_params(block.mlp_norm)
        counts["norm"] += _norm_params(self.norm)
        counts["total"] = sum(p.numel() for p in self.parameters())  # parameters() dedupes tied weights
        return counts

    def flops_per_token(self, seq_len: Optional[int] = None) -> float:
        """Training FLOPs per token on seq_len windows (default max_seq_len): 6 per matmul weight,
        plus causal attention (half of PaLM's 12·L·d·T). The accounting is in model/flops.py."""
        from model.flops import training_flops_per_token  # the one accounting, shared with scripts/estimate.py
        return float(training_flops_per_token(self, seq_len or self.cfg.max_seq_len).total)


_NORM_TYPES = tuple(set(NORMS.values()))


def _params(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def _norm_params(module: nn.Module) -> int:
    return sum(_params(m) for m in module.modules() if isinstance(m, _NORM_TYPES))
