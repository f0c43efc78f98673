"""RMSNorm against its float64 formula, its precision and reduction properties; LayerNorm against torch's."""
import pytest
import torch

from model import NORMS, LayerNorm, RMSNorm


def rmsnorm_float64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x, weight = x.double(), weight.double()
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * weight


def test_rmsnorm_matches_formula_in_float64():
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(16))
    x = 3 * torch.randn(2, 5, 16)
    torch.testing.assert_close(norm(x).double(), rmsnorm_float64(x, norm.weight, 1e-5), rtol=1e-6, atol=1e-6)


def test_rmsnorm_eps_is_inside_the_root():
    # A zero vector must come out as zeros (finite), not NaN: eps guards the rsqrt.
    out = RMSNorm(8, eps=1e-5)(torch.zeros(1, 8))
    assert torch.equal(out, torch.zeros(1, 8))
    # And eps is added to the mean square, not to the root: for a tiny x it dominates exactly so.
    x = torch.full((1, 8), 1e-3)
    torch.testing.assert_close(RMSNorm(8, eps=1e-2)(x), x / (1e-6 + 1e-2) ** 0.5)


def test_rmsnorm_reduces_over_last_dim_only():
    torch.manual_seed(0)
    norm = RMSNorm(16)
    x = torch.randn(2, 6, 16)
    y = x.clone()
    y[1, 3] *= 10.0
    y[1, 3, 0] += 5.0  # change this token's scale and direction
    out_x, out_y = norm(x), norm(y)
    changed = torch.zeros(2, 6, dtype=torch.bool)
    changed[1, 3] = True
    assert torch.equal(out_x[~changed], out_y[~changed]), "another token's output moved"
    assert not torch.allclose(out_x[1, 3], out_y[1, 3])


def test_rmsnorm_output_has_unit_rms_with_unit_weight():
    torch.manual_seed(0)
    out = RMSNorm(64, eps=1e-8)(5 * torch.randn(3, 7, 64) + 2)
    torch.testing.assert_close(out.pow(2).mean(-1), torch.ones(3, 7))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rmsnorm_keeps_low_precision_dtype_and_computes_in_fp32(dtype):
    torch.manual_seed(0)
    norm = RMSNorm(32).to(dtype)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(32))
    x = torch.randn(4, 9, 32).to(dtype)
    out = norm(x)
    assert out.dtype == dtype
    # The HF recipe: normalise in fp32, cast back, then scale by the weight in the input dtype.
    x32 = x.float()
    expected = norm.weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)).to(dtype)
    torch.testing.assert_close(out, expected)  # dtype-aware tolerances: ~1 ulp of bf16/fp16


def test_rmsnorm_fp16_does_not_overflow():
    # 300² = 9e4 > fp16's max 65504: squaring in fp16 gives inf and the output collapses to 0.
    x = torch.full((1, 4, 8), 300.0, dtype=torch.float16)
    naive = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    assert torch.all(naive == 0)  # the failure the upcast prevents
    out = RMSNorm(8).half()(x)
    torch.testing.assert_close(out, torch.ones_like(x))


def test_rmsnorm_weight_starts_at_ones_and_scales_per_channel():
    norm = RMSNorm(4)
    assert torch.equal(norm.weight.data, torch.ones(4))
    x = torch.randn(3, 4)
    base = norm(x)
    with torch.no_grad():
        norm.weight.copy_(torch.tensor([1.0, 2.0, 0.0, -1.0]))
    torch.testing.assert_close(norm(x), base * torch.tensor([1.0, 2.0, 0.0, -1.0]))


def test_layernorm_matches_torch_and_centres():
    torch.manual_seed(0)
    ours, ref = LayerNorm(16, eps=1e-5), torch.nn.LayerNorm(16, eps=1e-5)
    with torch.no_grad():
        for p_ours, p_ref in ((ours.weight, ref.weight), (ours.bias, ref.bias)):
            p_ours.copy_(torch.randn(16))
            p_ref.copy_(p_ours)
    x = 2 * torch.randn(3, 5, 16) + 4
    torch.testing.assert_close(ours(x), ref(x))
    centred = LayerNorm(16)(x)
    torch.testing.assert_close(centred.mean(-1), torch.zeros(3, 5), atol=1e-5, rtol=0)
    # RMSNorm does not centre: that is the difference the ablation measures.
    assert RMSNorm(16)(x).mean(-1).abs().min() > 0.5


def test_layernorm_keeps_bf16():
    x = torch.randn(2, 3, 8, dtype=torch.bfloat16)
    assert LayerNorm(8)(x).dtype == torch.bfloat16


def test_norms_registry():
    assert NORMS == {"rmsnorm": RMSNorm, "layernorm": LayerNorm}
