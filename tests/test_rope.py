"""RoPE: the tables against the formula, rotate-half pairing, norm preservation, relative positions (also
through the attention module: q and k both rotated)."""
import math

import torch

from model import apply_rope, rope_tables


def test_tables_match_formula():
    head_dim, theta = 8, 500.0
    cos, sin = rope_tables(head_dim, 40, theta)
    assert cos.shape == sin.shape == (40, head_dim) and cos.dtype == torch.float32
    for t in (0, 1, 7, 39):
        for i in range(head_dim):
            angle = t * theta ** (-2 * (i % (head_dim // 2)) / head_dim)  # frequencies repeat: rotate-half
            assert math.isclose(cos[t, i].item(), math.cos(angle), abs_tol=1e-6)
            assert math.isclose(sin[t, i].item(), math.sin(angle), abs_tol=1e-6)



def test_tables_are_exact_to_fp32_rounding_at_long_positions():
    """Position × frequency reaches ~8k rad at the end of an 8k context: the angles must be computed in
    float64 (fp32 frequencies alone would put ~5e-4 rad of error into the last positions)."""
    head_dim, positions = 64, torch.tensor([1000, 4095, 8191])
    cos, sin = rope_tables(head_dim, 8192, 10000.0)
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[:, None].double() * torch.cat([inv_freq, inv_freq])
    assert (cos[positions].double() - angles.cos()).abs().max() < 1e-7
    assert (sin[positions].double() - angles.sin()).abs().max() < 1e-7


def test_default_theta_is_llamas_10000():
    assert all(torch.equal(a, b) for a, b in zip(rope_tables(16, 32), rope_tables(16, 32, 10000.0)))
    assert not torch.equal(rope_tables(16, 32)[0], rope_tables(16, 32, 10001.0)[0])

def test_position_zero_is_identity():
    cos, sin = rope_tables(16, 4)
    x = torch.randn(2, 1, 3, 16)
    torch.testing.assert_close(apply_rope(x, cos[:1], sin[:1]), x)


def test_dimension_i_pairs_with_i_plus_half():
    # HF's rotate-half layout (not interleaved pairs 2i, 2i+1): the exported weights need no permutation.
    head_dim = 8
    cos, sin = rope_tables(head_dim, 2, theta=1.0)  # theta 1: every pair turns by 1 rad per position
    x = torch.zeros(1, 1, 1, head_dim)
    x[..., 1] = 1.0
    out = apply_rope(x, cos[1:2], sin[1:2])[0, 0, 0]
    expected = torch.zeros(head_dim)
    expected[1], expected[1 + head_dim // 2] = math.cos(1.0), math.sin(1.0)
    torch.testing.assert_close(out, expected)


def test_rope_preserves_vector_norms():
    torch.manual_seed(0)
    cos, sin = rope_tables(32, 64)
    x = torch.randn(2, 64, 4, 32)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    head_dim = 16
    cos, sin = rope_tables(head_dim, 64)
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(m: int, n: int) -> float:
        q_m = apply_rope(q.view(1, 1, 1, -1), cos[m:m + 1], sin[m:m + 1])
        k_n = apply_rope(k.view(1, 1, 1, -1), cos[n:n + 1], sin[n:n + 1])
        return (q_m * k_n).sum().item()

    for m, n in ((5, 2), (9, 9), (3, 11)):
        for shift in (1, 17, 40):
            assert math.isclose(score(m, n), score(m + shift, n + shift), rel_tol=1e-4, abs_tol=1e-5)
    assert not math.isclose(score(5, 2), score(5, 3), rel_tol=1e-3)  # and it does depend on m - n


def test_bf16_input_stays_bf16():
    cos, sin = rope_tables(8, 4)
    out = apply_rope(torch.randn(1, 4, 2, 8, dtype=torch.bfloat16), cos, sin)
    assert out.dtype == torch.bfloat16


def attention_at(attn, x, start: int, cos, sin):
    """The attention module's output for x placed at positions start .. start + T - 1."""
    T = x.shape[1]
    return attn(x, cos[start:start + T], sin[start:start + T])


def test_attention_sees_relative_positions_only():
    """RoPE on both q and k: shifting every position by the same amount changes no output. Rotating
    only one of them (or the two by different tables) leaves absolute positions in the scores."""
    from model.attention import Attention
    from model_helpers import tiny_model_config

    torch.manual_seed(0)
    cfg = tiny_model_config(max_seq_len=64)
    attn = Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():  # scores far from uniform, so the positions in them show in the output
        attn.q_proj.weight.normal_(0.0, 0.3)
        attn.k_proj.weight.normal_(0.0, 0.3)
    cos, sin = rope_tables(cfg.head_dim, 64)
    x = torch.randn(2, 10, cfg.hidden_size)
    with torch.no_grad():
        at_zero = attention_at(attn, x, 0, cos, sin)
        for start in (1, 13, 54):
            torch.testing.assert_close(attention_at(attn, x, start, cos, sin), at_zero, rtol=1e-4, atol=1e-5)
        # ... and the rotation is really applied: without it (cos 1, sin 0) the output differs.
        unrotated = attn(x, torch.ones(10, cfg.head_dim), torch.zeros(10, cfg.head_dim))
        assert (unrotated - at_zero).abs().max() > 1e-3
