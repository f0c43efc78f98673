"""RMSNorm against its float64 formula, its precision and reduction properties; the bf16 variant really
computing in bf16; LayerNorm against torch's; norm=none; every norm's init_weights."""

import pytest
import torch

from model import NORMS, LayerNorm, NoNorm, RMSNorm, RMSNormBF16


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
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    assert torch.equal(out, norm.weight * normed.to(dtype))  # bit for bit, not within 1 ulp
    # Scaling in fp32 and rounding once is a different recipe, which these inputs tell apart.
    assert not torch.equal(out, (norm.weight.float() * normed).to(dtype))


def test_rmsnorm_with_an_fp32_weight_returns_fp32_for_bf16_input():
    """The autocast case (fp32 parameters, bf16 activations): cast back to bf16, then the fp32 weight
    promotes the product to fp32 — as HF's LlamaRMSNorm, so the exported model computes the same."""
    torch.manual_seed(0)
    norm = RMSNorm(32)
    with torch.no_grad():
        norm.weight.copy_(1 + 0.5 * torch.randn(32))
    x = torch.randn(4, 9, 32).bfloat16()
    out = norm(x)
    x32 = x.float()
    normed = (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)).bfloat16()
    assert out.dtype == torch.float32 and torch.equal(out, norm.weight * normed)


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


def rmsnorm_bf16_recipe_float64(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The no-upcast recipe written out in float64, rounding to bf16 after every step a bf16 model takes."""

    def bf16(t):
        return t.to(torch.bfloat16).double()

    x = bf16(x.double())
    variance = bf16(bf16(x * x).mean(dim=-1, keepdim=True))
    y = bf16(x * bf16(torch.rsqrt(bf16(variance + eps))))
    return (weight.double() * y).float()  # back in the fp32 input dtype, scaled by the fp32 weight


def crafted_input() -> torch.Tensor:
    """Values between bf16's grid points (spacing 2^-7 near 1): rounding them to bf16 moves every one."""
    steps = torch.arange(64, dtype=torch.float64)
    rows = [1 + (steps + 0.37) * 2**-11, 3 - (steps + 0.61) * 2**-10, 0.01 * (1 + steps * 2**-9)]
    return torch.stack(rows).float()  # (3, 64), exact in fp32


def test_rmsnorm_bf16_computes_in_bf16():
    x = crafted_input()
    weight = 1 + torch.linspace(-0.5, 0.5, 64)
    fp32, bf16 = RMSNorm(64), RMSNormBF16(64)
    with torch.no_grad():
        fp32.weight.copy_(weight)
        bf16.weight.copy_(weight)
    out = bf16(x)
    assert out.dtype == torch.float32  # the input dtype comes back
    # Exactly the bf16 recipe: every intermediate rounded to bf16 ...
    assert torch.equal(out, rmsnorm_bf16_recipe_float64(x, weight, bf16.eps))
    # ... which is not what the upcasting RMSNorm computes: off by bf16-scale error (2^-8 ≈ 0.4 %), not
    # by fp32 noise (~1e-7) and not by garbage.
    relative = ((out - fp32(x)) / fp32(x)).abs().max().item()
    assert 1e-3 < relative < 2e-2, relative
    assert not torch.equal(fp32(x), rmsnorm_bf16_recipe_float64(x, weight, fp32.eps))
    # Autocast changes nothing: the variant chooses bf16 itself, on every device and precision.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(bf16(x), out)


def test_no_norm_is_the_identity_without_parameters():
    x = torch.randn(2, 3, 8)
    norm = NoNorm(8, eps=1e-5)
    assert norm(x) is x and list(norm.parameters()) == []


@pytest.mark.parametrize("name", sorted(NORMS))
def test_init_weights_restores_a_fresh_norm(name):
    """What holds a new norm: its init_weights(std, out_std) must put every parameter back where
    construction put it (meta-device builds get their values only from init_weights)."""
    norm = NORMS[name](16, eps=1e-5)
    fresh = {k: v.clone() for k, v in norm.state_dict().items()}
    with torch.no_grad():
        for p in norm.parameters():
            p.add_(torch.randn_like(p))
    norm.init_weights(0.02, 0.005)
    assert all(torch.equal(v, fresh[k]) for k, v in norm.state_dict().items())


def test_norms_registry():
    assert NORMS == {"rmsnorm": RMSNorm, "rmsnorm_bf16": RMSNormBF16, "layernorm": LayerNorm, "none": NoNorm}


@pytest.mark.parametrize("eps", [None, 0.5])
def test_layernorm_eps_default_and_given_are_torchs(eps):
    """Inputs with a variance near eps, where eps decides the output: the default is torch's 1e-5, and
    a given eps reaches the kernel."""
    kwargs = {} if eps is None else {"eps": eps}
    x = 1e-3 * torch.randn(4, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(LayerNorm(16, **kwargs)(x), torch.nn.LayerNorm(16, **kwargs)(x))


def test_rmsnorm_bf16_gives_back_the_input_dtype_whatever_the_weight_dtype():
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(0))
    assert RMSNormBF16(8).to(torch.bfloat16)(x).dtype == torch.float32
    assert RMSNorm(8).to(torch.bfloat16)(x).dtype == torch.float32  # as the upcasting RMSNorm does
