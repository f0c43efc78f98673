"""SwiGLU's width rule (Meta's table), its fused gate/up split, and the baseline MLPs."""

import pytest
import torch
import torch.nn.functional as F

from model import MLPS, SwiGLU, swiglu_intermediate_size
from model.mlp import GeGLU, GeluMLP, ReLU2MLP


@pytest.mark.parametrize(
    "hidden_size, multiple_of, multiplier, expected",
    [
        (4096, 256, None, 11008),  # LLaMA-1/2 7B
        (256, 32, None, 704),  # int(682.67) = 682 → next multiple of 32
        (288, 32, None, 768),  # 8·288/3 = 768 exactly: already a multiple, no rounding
        (5120, 256, None, 13824),  # LLaMA 13B
        (8192, 4096, 1.3, 28672),  # LLaMA-2 70B: ffn_dim_multiplier, truncated, then rounded
        (4096, 1024, 1.3, 14336),  # LLaMA-3 8B
    ],
)
def test_intermediate_size_table(hidden_size, multiple_of, multiplier, expected):
    assert swiglu_intermediate_size(hidden_size, multiple_of, multiplier) == expected


@pytest.mark.parametrize("multiple_of", [1, 16, 32, 64, 256])
def test_intermediate_size_rounds_up_to_the_multiple(multiple_of):
    for d in range(8, 1200, 8):
        size, theory = swiglu_intermediate_size(d, multiple_of), int(8 * d / 3)
        assert size % multiple_of == 0
        assert theory <= size < theory + multiple_of, (d, size)  # up, never down, never a step too far


def test_swiglu_first_half_is_gate_second_is_up():
    torch.manual_seed(0)
    mlp = SwiGLU(16, 24)
    assert mlp.gate_up_proj.weight.shape == (2 * 24, 16)  # one fused d → 2I matmul, then back to d
    x = torch.randn(3, 16)
    w_gate, w_up = mlp.gate_up_proj.weight[:24], mlp.gate_up_proj.weight[24:]
    expected = (F.silu(x @ w_gate.T) * (x @ w_up.T)) @ mlp.down_proj.weight.T
    torch.testing.assert_close(mlp(x), expected)


@pytest.mark.parametrize("half", ["gate", "up"])
def test_swiglu_both_halves_matter(half):
    # A `chunk(...)[0]` slip (using one half twice) leaves the other half's weights dead: this catches it.
    torch.manual_seed(0)
    mlp = SwiGLU(16, 24)
    x = torch.randn(4, 16)
    rows = slice(0, 24) if half == "gate" else slice(24, 48)
    before = mlp(x)
    with torch.no_grad():
        mlp.gate_up_proj.weight[rows] += torch.randn(24, 16)
    assert not torch.allclose(mlp(x), before, atol=1e-4)
    mlp(x).sum().backward()
    assert mlp.gate_up_proj.weight.grad[rows].abs().sum() > 0


def test_geglu_uses_gelu_gate():
    torch.manual_seed(0)
    mlp = GeGLU(16, 24)
    x = torch.randn(3, 16)
    gate, up = (x @ mlp.gate_up_proj.weight.T).chunk(2, dim=-1)
    torch.testing.assert_close(mlp(x), (F.gelu(gate) * up) @ mlp.down_proj.weight.T)


@pytest.mark.parametrize("cls, activation", [(GeluMLP, F.gelu), (ReLU2MLP, lambda h: F.relu(h) ** 2)])
def test_two_matrix_mlps_match_formula(cls, activation):
    torch.manual_seed(0)
    mlp = cls(16, 64)
    x = torch.randn(3, 16)
    torch.testing.assert_close(mlp(x), activation(x @ mlp.up_proj.weight.T) @ mlp.down_proj.weight.T)


@pytest.mark.parametrize("hidden_size, multiple_of", [(256, 32), (4096, 256), (768, 256)])
def test_swiglu_params_match_a_4d_mlp(hidden_size, multiple_of):
    # The point of 8/3: three d×I matrices cost what two d×4d ones do (up to the rounding slack).
    size = swiglu_intermediate_size(hidden_size, multiple_of)
    gated, classic = 3 * hidden_size * size, 8 * hidden_size**2
    assert classic <= gated < classic + 3 * hidden_size * multiple_of


@pytest.mark.parametrize("name", sorted(MLPS))
def test_dropout_is_inverted_dropout_on_the_output_in_training_only(name):
    """Training: each output element is either dropped (0) or the eval output scaled by 1/(1-p) — dropout
    on the MLP's output, not inside it; about p of them dropped. Eval: deterministic, no dropout."""
    torch.manual_seed(0)
    mlp = MLPS[name](16, 48, dropout=0.25)
    x = torch.randn(64, 16)
    mlp.eval()
    clean = mlp(x)
    assert torch.equal(mlp(x), clean)
    mlp.train()
    noisy = mlp(x)
    kept = noisy != 0
    torch.testing.assert_close(noisy[kept], clean[kept] / 0.75)
    assert 0.2 < 1 - kept.float().mean().item() < 0.3  # 1024 elements: p = 0.25 ± 0.05 (3.7 σ)


def test_mlps_registry():
    assert MLPS == {"swiglu": SwiGLU, "geglu": GeGLU, "gelu": GeluMLP, "relu2": ReLU2MLP}
