"""ModelConfig: the model's only input, with every derived size computed and validated here.

Fields hold what the user set; `None` means "derive it". Derived sizes are properties computed
from the current fields on every read, so `dataclasses.replace(cfg, hidden_size=512)` re-derives
them and can never carry a stale value, while a value the user set stays set.
"""
from dataclasses import dataclass
from typing import Optional

from model.mlp import MLPS, swiglu_intermediate_size
from model.norm import NORMS
from model.parametrization import PARAMETRIZATIONS
from model.rounding import find_multiple

ATTENTION_KERNELS = ("auto", "sdpa", "matmul", "hybrid")  # model/attention.py: kernel_for


@dataclass
class ModelConfig:
    vocab_size: int = 4096  # token ids the tokenizer can produce (its max id + 1)
    # The embedding and LM head get padded_vocab_size rows: vocab_size rounded UP to this multiple,
    # so the largest matmul has hardware-friendly sizes (GPT-2's 50,257 → 50,304). 1 = no padding.
    vocab_multiple: int = 64
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
    qk_norm: bool = False  # RMSNorm over head_dim on q and k before RoPE (OLMo-2, Qwen3)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    dropout: float = 0.0
    init_std: float = 0.02
    # sp: fixed init std and one lr for every matrix. mup: init, lrs, attention and logits scale with
    # width so that the best lr stays put as hidden_size grows (model/parametrization.py, docs/mup.md).
    parametrization: str = "sp"
    mup_base_width: int = 256  # the hidden_size at which mup and sp are the same network
    # Arms of the width-512 AdamW experiment (docs/mup.md): mup's attention scale sqrt(d0)/d ("mup") or sp's
    # 1/sqrt(d) under mup too ("sp"); and the query projection initialised to zero (TP5's D.2: scores start at 0).
    mup_attention_scale: str = "mup"
    zero_query_init: bool = False
    # How attention is computed (the same function): sdpa (torch's fused kernels), matmul (two matmuls and an
    # fp32 softmax), hybrid (SDPA's CPU forward, a backward of matmuls), or auto: in a compiled bf16 CPU model
    # hybrid, or matmul where attention dropout trains over <= 256 keys, measured faster there; sdpa elsewhere.
    attention_kernel: str = "auto"

    @classmethod
    def from_dict(cls, fields: dict) -> "ModelConfig":
        """A config from a saved dict (model_config.json), including files written before padding.

        Files without `vocab_multiple` predate padded vocabularies: their embedding has exactly
        vocab_size rows, so they load with vocab_multiple=1. Their resolved n_kv_heads and
        intermediate_size load as explicit values, which describe the same network. Files without
        `parametrization` predate μP: they load as sp, the default (mup_base_width is then unused).
        """
        return cls(**{"vocab_multiple": 1, **fields})

    def __post_init__(self):
        for name in ("vocab_size", "vocab_multiple", "hidden_size", "n_layers", "n_heads", "max_seq_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"model.{name}={getattr(self, name)} must be a positive integer")
        if self.norm not in NORMS:
            raise ValueError(f"model.norm={self.norm!r} is unknown; choose one of {sorted(NORMS)}")
        if self.parametrization not in PARAMETRIZATIONS:
            raise ValueError(f"model.parametrization={self.parametrization!r} is unknown; choose one of "
                             f"{list(PARAMETRIZATIONS)}")
        if self.mup_attention_scale not in ("mup", "sp"):
            raise ValueError(f"model.mup_attention_scale={self.mup_attention_scale!r} is unknown; choose mup "
                             "(sqrt(d0)/d) or sp (1/sqrt(d))")
        if self.mup_base_width <= 0:
            raise ValueError(f"model.mup_base_width={self.mup_base_width} must be a positive integer (the "
                             "hidden_size at which mup equals sp, e.g. 256)")
        if self.attention_kernel not in ATTENTION_KERNELS:
            raise ValueError(f"model.attention_kernel={self.attention_kernel!r} is unknown; choose one of "
                             f"{list(ATTENTION_KERNELS)}")
        if self.mlp not in MLPS:
            raise ValueError(f"model.mlp={self.mlp!r} is unknown; choose one of {sorted(MLPS)}")
        if self.multiple_of <= 0:
            raise ValueError(f"model.multiple_of={self.multiple_of} must be > 0 (e.g. 32 or 256)")
        if self.hidden_size % self.n_heads:
            raise ValueError(
                f"model.hidden_size={self.hidden_size} is not divisible by model.n_heads={self.n_heads}; "
                f"pick n_heads from {_divisors(self.hidden_size)}")
        if self.n_kv_heads is not None and (self.n_kv_heads <= 0 or self.n_heads % self.n_kv_heads):
            raise ValueError(
                f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}; "
                f"pick one of {_divisors(self.n_heads)} (or null for n_heads)")
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
        if self.intermediate_size is not None and self.intermediate_size <= 0:
            raise ValueError(f"model.intermediate_size={self.intermediate_size} must be > 0 or null (derived)")

    # ---- derived sizes: read these, not the fields, when building the network ---------------------
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        """n_kv_heads, or n_heads when unset (plain multi-head attention)."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def resolved_intermediate_size(self) -> int:
        """intermediate_size, or the width rule of the mlp kind when unset."""
        return self.derived_intermediate_size() if self.intermediate_size is None else self.intermediate_size

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the embedding and LM head: vocab_size rounded up to vocab_multiple.

        The ids from vocab_size up are padding: no token has them, training never targets them and
        generation masks them out.
        """
        return find_multiple(self.vocab_size, self.vocab_multiple)

    @property
    def depth(self) -> str:
        """"1 layer" or "N layers": how the run header and the summaries print the shape."""
        return f"{self.n_layers} layer{'s' * (self.n_layers != 1)}"

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
