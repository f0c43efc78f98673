"""ModelConfig: the model's only input, with every derived size computed and validated here."""
from dataclasses import dataclass
from typing import Optional

from model.mlp import MLPS, swiglu_intermediate_size
from model.norm import NORMS


@dataclass
class ModelConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    n_layers: int = 6
    n_heads: int = 8
    n_kv_heads: Optional[int] = None  # None = n_heads (plain multi-head attention)
    multiple_of: int = 32
    ffn_dim_multiplier: Optional[float] = None
    intermediate_size: Optional[int] = None  # None = derived from hidden_size and the mlp kind
    max_seq_len: int = 256
    norm: str = "rmsnorm"
    mlp: str = "swiglu"
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "n_layers", "n_heads", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be a positive integer")
        if self.norm not in NORMS:
            raise ValueError(f"model.norm={self.norm!r} is unknown; choose one of {sorted(NORMS)}")
        if self.mlp not in MLPS:
            raise ValueError(f"model.mlp={self.mlp!r} is unknown; choose one of {sorted(MLPS)}")
        if self.multiple_of <= 0:
            raise ValueError(f"model.multiple_of={self.multiple_of} must be > 0 (e.g. 32 or 256)")
        if self.hidden_size % self.n_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.n_heads={self.n_heads}; "
                f"pick n_heads from {_divisors(self.hidden_size)}")
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}; "
                f"pick one of {_divisors(self.n_heads)}")
        if self.head_dim % 2:
            raise ValueError(
                f"head_dim = hidden_size/n_heads = {self.head_dim} is odd, but RoPE rotates pairs of "
                "dimensions; change model.hidden_size or model.n_heads so it is even")
        if self.ffn_dim_multiplier is not None and self.ffn_dim_multiplier <= 0:
            raise ValueError(f"model.ffn_dim_multiplier={self.ffn_dim_multiplier} must be > 0 or null")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"model.dropout={self.dropout} must be in [0, 1)")
        for name, example in (("norm_eps", "1e-5"), ("rope_theta", "10000.0"), ("init_std", "0.02")):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be > 0 (e.g. {example})")
        if self.intermediate_size is None:
            self.intermediate_size = self.derived_intermediate_size()
        elif self.intermediate_size <= 0:
            raise ValueError(f"model.intermediate_size={self.intermediate_size} must be > 0 or null (derived)")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    def derived_intermediate_size(self) -> int:
        """The MLP width this config gets when intermediate_size is not set explicitly."""
        if MLPS[self.mlp].gated:
            return swiglu_intermediate_size(self.hidden_size, self.multiple_of, self.ffn_dim_multiplier)
        # Two-matrix MLPs use the classic 4·d, so they match a gated MLP's parameter count.
        return 4 * self.hidden_size


# MLP kinds with three projections, which take the 8/3·d rule instead of 4·d.
GATED_MLPS = tuple(name for name, cls in MLPS.items() if cls.gated)


def _divisors(n: int) -> list:
    return [k for k in range(1, n + 1) if n % k == 0]
