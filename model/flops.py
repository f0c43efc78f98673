"""Training FLOPs per token (the MFU numerator): weight matmuls, plus causal attention over the context."""
from dataclasses import dataclass

from torch import nn


@dataclass(frozen=True)
class TokenFlops:
    """FLOPs one training token costs (forward + backward), by kind."""

    weights: int  # 6 · N_matmul: each weight is one multiply-add (2 FLOPs) forward, two backward
    attention: int  # QKᵀ and attention·V over the causal context, forward + backward

    @property
    def total(self) -> int:
        return self.weights + self.attention


def matmul_weights(model: nn.Module) -> int:
    """Weights a token is multiplied by: every Linear (attention with GQA's narrower k/v, MLP, and
    the LM head even when tied to the embedding — its matmul still runs, padded rows included).
    The embedding is a lookup, free; norms and biases are elementwise, left out by convention."""
    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def matmul_shapes(model: nn.Module, rows: int) -> list:
    """(rows, in_features, out_features) of each distinct Linear: the weight matmuls a batch of `rows` tokens
    runs (training/precision.py times them to choose bf16 or fp32). Works on a meta-device model."""
    return list(dict.fromkeys((rows, m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)))


def attention_flops_per_token(n_layers: int, n_heads: int, head_dim: int, seq_len: int,
                              causal: bool = True) -> int:
    """Training FLOPs of the attention scores and their weighted sum, per token of a seq_len window.

    Query i of a causal window attends to keys 0..i: T(T+1)/2 query-key pairs per head, not T².
    Each pair costs head_dim multiply-adds in QKᵀ and head_dim in attention·V, i.e. 4·head_dim
    FLOPs forward, ×3 with backward: 6·n_heads·head_dim·(T+1) per token per layer — half (plus a
    diagonal) of PaLM's 12·L·d·T, which counts the masked half too. GQA shares k/v heads but every
    query head still scores every key, so the query head count is what matters here. FlashAttention's
    recomputation of the scores in backward is not model work and is not counted (as in PaLM).
    """
    twice_pairs_per_token = seq_len + 1 if causal else 2 * seq_len  # 2× the mean keys per query
    return n_layers * n_heads * head_dim * 6 * twice_pairs_per_token


def training_flops_per_token(model: nn.Module, seq_len: int) -> TokenFlops:
    """FLOPs per token of a training step on windows of seq_len tokens, for a Transformer-like model
    with a `cfg` (n_layers, n_heads, head_dim). Works on a meta-device model (no memory needed)."""
    cfg = model.cfg
    return TokenFlops(weights=6 * matmul_weights(model),
                      attention=attention_flops_per_token(cfg.n_layers, cfg.n_heads, cfg.head_dim, seq_len))
