"""ModelConfig: the model's only input, every derived size (and μP's multipliers) computed and checked here."""

import math
from dataclasses import dataclass
from typing import Optional

PARAMETRIZATIONS = ("sp", "mup")  # docs/mup.md derives each μP rule used below


def find_multiple(n: int, k: int) -> int:
    """The smallest multiple of k that is >= n (litgpt's): up, never down, so no capacity or token id is lost."""
    if k <= 0:
        raise ValueError(f"cannot round {n} up to a multiple of {k}; the multiple must be > 0")
    return n if n % k == 0 else n + k - n % k


@dataclass
class ModelConfig:
    vocab_size: int = 4096  # token ids the tokenizer can produce (its max id + 1)
    vocab_multiple: int = 64  # embedding and head rows: vocab_size rounded UP to this (50,257 → 50,304); 1 = none
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
    # sp: one init std and lr for every matrix; mup: init, lrs, attention and logits scale with width so the best
    # lr stays put as hidden_size grows. mup equals sp at hidden_size = mup_base_width.
    parametrization: str = "sp"
    mup_base_width: int = 256
    # Arms of docs/mup.md's width-512 AdamW experiment: sp's 1/sqrt(d) attention scale under mup, a zero query init.
    mup_attention_scale: str = "mup"
    zero_query_init: bool = False

    def __post_init__(self):
        from model.mlp import MLPS  # the variants' classes, hence torch: only once a model config is built
        from model.norm import NORMS

        def check(ok: bool, message: str) -> None:
            if not ok:
                raise ValueError(message)

        for name in ("vocab_size", "vocab_multiple", "hidden_size", "n_layers", "n_heads", "max_seq_len"):
            check(getattr(self, name) > 0, f"model.{name}={getattr(self, name)} must be a positive integer")
        for name, known in (("norm", NORMS), ("mlp", MLPS), ("parametrization", PARAMETRIZATIONS)):
            check(
                getattr(self, name) in known,
                f"model.{name}={getattr(self, name)!r} is unknown; choose one of {list(known)}",
            )
        check(
            self.mup_attention_scale in ("mup", "sp"),
            f"model.mup_attention_scale={self.mup_attention_scale!r} is unknown; choose mup (sqrt(d0)/d) or sp",
        )
        check(self.mup_base_width > 0, f"model.mup_base_width={self.mup_base_width} must be a positive integer")
        check(self.multiple_of > 0, f"model.multiple_of={self.multiple_of} must be > 0 (e.g. 32 or 256)")
        divisors = lambda n: [k for k in range(1, n + 1) if n % k == 0]  # noqa: E731
        check(
            self.hidden_size % self.n_heads == 0,
            f"model.hidden_size={self.hidden_size} is not divisible by "
            f"model.n_heads={self.n_heads}; pick n_heads from {divisors(self.hidden_size)}",
        )
        check(
            self.n_kv_heads is None or (self.n_kv_heads > 0 and self.n_heads % self.n_kv_heads == 0),
            f"model.n_kv_heads={self.n_kv_heads} must divide model.n_heads={self.n_heads}; pick one of "
            f"{divisors(self.n_heads)} (or null for n_heads)",
        )
        check(
            self.head_dim % 2 == 0,
            f"head_dim = hidden_size/n_heads = {self.head_dim} is odd, but RoPE rotates "
            "pairs of dimensions; change model.hidden_size or model.n_heads so it is even",
        )
        check(
            self.ffn_dim_multiplier is None or self.ffn_dim_multiplier > 0,
            f"model.ffn_dim_multiplier={self.ffn_dim_multiplier} must be > 0 or null",
        )
        check(0.0 <= self.dropout < 1.0, f"model.dropout={self.dropout} must be in [0, 1)")
        for name, example in (("norm_eps", "1e-5"), ("rope_theta", "10000.0"), ("init_std", "0.02")):
            check(getattr(self, name) > 0, f"model.{name}={getattr(self, name)} must be > 0 (e.g. {example})")
        check(
            self.intermediate_size is None or self.intermediate_size > 0,
            f"model.intermediate_size={self.intermediate_size} must be > 0 or null (derived)",
        )

    # Derived sizes: read these, not the fields, when building the network. Properties, so a replace() re-derives.
    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.n_heads

    @property
    def resolved_n_kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def resolved_intermediate_size(self) -> int:
        return self.derived_intermediate_size() if self.intermediate_size is None else self.intermediate_size

    @property
    def padded_vocab_size(self) -> int:
        """Embedding and head rows: ids from vocab_size up are padding, never targeted and never generated."""
        return find_multiple(self.vocab_size, self.vocab_multiple)

    @property
    def depth(self) -> str:
        return f"{self.n_layers} layer{'s' * (self.n_layers != 1)}"

    def derived_intermediate_size(self) -> int:
        """The MLP width when intermediate_size is not set: gated MLPs 8/3·d rounded up, the others 4·d (same params)."""
        from model.mlp import MLPS, swiglu_intermediate_size

        if MLPS[self.mlp].gated:
            return swiglu_intermediate_size(self.hidden_size, self.multiple_of, self.ffn_dim_multiplier)
        return 4 * self.hidden_size

    # μP (Yang et al. 2022, Table 3): m = hidden_size / mup_base_width; under sp every multiplier is 1 or None.
    @property
    def width_multiplier(self) -> float:
        return self.hidden_size / self.mup_base_width if self.parametrization == "mup" else 1.0

    @property
    def hidden_init_scale(self) -> float:
        """× init std of the blocks' matrices: 1/sqrt(m), their variance ∝ 1/fan_in relative to the base width."""
        return 1.0 / math.sqrt(self.width_multiplier)

    @property
    def output_multiplier(self) -> Optional[float]:
        """The LM head's input × 1/m under mup (MuReadout; on the input: a tied weight is the embedding); None under sp."""
        return 1.0 / self.width_multiplier if self.parametrization == "mup" else None

    @property
    def attention_scale(self) -> Optional[float]:
        """q·k's scale: sqrt(base head_dim)/head_dim under mup (∝ 1/head_dim: q and k grow correlated with width,
        SDPA's 1/sqrt(head_dim) at the base width); None = SDPA's own, under sp or mup_attention_scale=sp."""
        if self.parametrization != "mup" or self.mup_attention_scale != "mup":
            return None
        return math.sqrt(self.head_dim / self.width_multiplier) / self.head_dim

    def describe_parametrization(self) -> str:
        if self.parametrization == "sp":
            return "sp"
        return f"mup (m = {self.width_multiplier:g} over base width {self.mup_base_width})"
