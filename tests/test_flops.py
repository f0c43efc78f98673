"""model/flops.py: training FLOPs per token against a hand count and against torch's FlopCounterMode."""
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from model import ModelConfig, Transformer
from model.flops import attention_flops_per_token, training_flops_per_token

# vocab 128 (a multiple of 64: no padding), d 32, 2 layers, 4 query heads of 8, 2 k/v heads, MLP width 64.
TINY = dict(vocab_size=128, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64, max_seq_len=16)


def test_hand_count_of_a_tiny_gqa_model():
    flops = training_flops_per_token(Transformer(ModelConfig(**TINY)), seq_len=16)
    q, k, v, o = 32 * 32, 32 * 16, 32 * 16, 32 * 32  # GQA: k and v project to 2 heads × 8
    mlp = 32 * 2 * 64 + 64 * 32  # fused gate+up, then down
    head = 128 * 32  # tied to the embedding, but its matmul still runs
    assert flops.weights == 6 * (2 * (q + k + v + o + mlp) + head) == 135_168
    # Causal: query i scores i+1 keys, 16·17/2 = 136 pairs per head per window, i.e. 8.5 per token;
    # 2·8 FLOPs for QKᵀ + 2·8 for attention·V per pair, ×3 for backward, 4 heads, 2 layers.
    assert flops.attention == 2 * 4 * 3 * (2 * 8 + 2 * 8) * 136 // 16 == 6_528
    assert flops.total == 141_696
    assert Transformer(ModelConfig(**TINY)).flops_per_token(16) == 141_696.0


def test_causal_term_is_half_the_full_square_plus_the_diagonal():
    for T in (1, 16, 1024):
        full = attention_flops_per_token(12, 12, 64, T, causal=False)
        assert full == 12 * 12 * 768 * T  # PaLM's 12·L·d·T
        assert attention_flops_per_token(12, 12, 64, T) * 2 * T == full * (T + 1)


def counted(model, x, backend=None):
    counter = FlopCounterMode(display=False)
    with (sdpa_kernel(backend) if backend else torch.enable_grad()), counter:
        model(x).sum().backward()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_matches_flop_counter_mode_on_a_tiny_model():
    """FlopCounterMode counts what the kernels do; the difference from ours is only the attention:

    - with the math SDPA backend attention is bmm's over the full T×T scores (the masked half is
      computed, then discarded): forward 2 bmm, backward 4 — PaLM's non-causal 12·L·d·T;
    - its fused-kernel formulas (flash/efficient/cudnn, CUDA) also count the full square, plus the
      scores recomputed in backward (2.5× forward, not 2×); the CPU flash kernel has no formula and
      counts 0. Model FLOPs count neither the masked half nor the recomputation.
    """
    model = Transformer(ModelConfig(**TINY))
    x = torch.randint(0, 128, (3, 16))
    ours = training_flops_per_token(model, 16)
    counts = counted(model, x, SDPBackend.MATH)
    tokens = x.numel()
    assert counts["aten.mm"] == ours.weights * tokens  # every Linear: forward, grad-input, grad-weight
    assert counts["aten.bmm"] == attention_flops_per_token(2, 4, 8, 16, causal=False) * tokens
    assert counts["aten.bmm"] * 17 == ours.attention * tokens * 2 * 16
    assert counted(model, x)["aten.mm"] == ours.weights * tokens  # the default kernel: same weights


def test_untied_head_and_padded_vocab_are_counted():
    tied = training_flops_per_token(Transformer(ModelConfig(**TINY)), 16).weights
    untied = training_flops_per_token(Transformer(ModelConfig(**{**TINY, "tie_embeddings": False})), 16).weights
    assert untied == tied  # same matmuls: tying shares storage, not work
    padded = training_flops_per_token(Transformer(ModelConfig(**{**TINY, "vocab_size": 100})), 16).weights
    assert padded == tied  # 100 pads to 128 rows, and the head computes all of them


def test_works_on_the_meta_device():
    with torch.device("meta"):
        model = Transformer(ModelConfig(**TINY))
    assert training_flops_per_token(model, 16).total == 141_696


@pytest.mark.parametrize("seq", [16, 8])
def test_method_defaults_to_max_seq_len(seq):
    model = Transformer(ModelConfig(**TINY))
    assert model.flops_per_token() == model.flops_per_token(16)
    assert model.flops_per_token(seq) == training_flops_per_token(model, seq).total
