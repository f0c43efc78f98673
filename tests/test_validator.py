"""activation_rms: per-layer RMS from hooks equals the RMS of the block outputs computed by hand."""
import math

import pytest
import torch

from model import Transformer
from tests.model_helpers import one_thread, random_transformer, tiny_model_config
from training.validator import activation_rms


def rms64(t: torch.Tensor) -> float:
    """sqrt(mean(x²)) over every element, in float64."""
    return math.sqrt(t.double().pow(2).mean().item())


def manual_block_rms(model: Transformer, input_ids: torch.Tensor) -> dict:
    """Runs the blocks one by one, as Transformer.forward does, and measures each stage."""
    T = input_ids.shape[1]
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    x = model.embed_tokens(input_ids)
    out = {"residual": [], "attn_in": [], "mlp_in": []}
    for block in model.layers:
        attn_in = block.attn_norm(x)
        mid = x + block.attn(attn_in, cos, sin)
        mlp_in = block.mlp_norm(mid)
        x = mid + block.mlp(mlp_in)
        for name, t in (("residual", x), ("attn_in", attn_in), ("mlp_in", mlp_in)):
            out[name].append(rms64(t))
    return out


@pytest.mark.parametrize("norm, mlp", [("rmsnorm", "swiglu"), ("layernorm", "gelu")])
def test_hooked_rms_equals_direct_computation(norm, mlp):
    with one_thread(), torch.no_grad():
        model = random_transformer(tiny_model_config(norm=norm, mlp=mlp, n_layers=3))
        input_ids = torch.randint(0, 61, (3, 20), generator=torch.Generator().manual_seed(0))
        stats = activation_rms(model, input_ids)
        expected = manual_block_rms(model, input_ids)
    for name in ("residual", "attn_in", "mlp_in"):
        assert len(stats[name]) == 3
        assert stats[name] == pytest.approx(expected[name], rel=1e-5), name
    # Random weights make every layer's scale different: a hook on the wrong module would show.
    assert len({round(v, 4) for v in stats["residual"]}) == 3


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_normed_inputs_have_unit_rms_at_init(norm):
    """What the norms are for: whatever the residual's scale, a block reads an RMS-1 input (weights
    are ones at init; LayerNorm's zero mean and unit variance also give RMS 1)."""
    with one_thread():
        model = Transformer(tiny_model_config(norm=norm)).eval()
        with torch.no_grad():
            model.embed_tokens.weight.mul_(1000.0)  # init std 0.02 → a residual stream of RMS ~20
        stats = activation_rms(model, torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1)))
    assert min(stats["residual"]) > 10
    assert stats["attn_in"] == pytest.approx([1.0] * 2, abs=1e-3)
    assert stats["mlp_in"] == pytest.approx([1.0] * 2, abs=1e-3)


def test_hooks_are_removed_after_the_measurement():
    """Training steps must pay nothing: no hook survives the call, even when the forward fails."""
    model = Transformer(tiny_model_config())
    activation_rms(model, torch.zeros(1, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="max_seq_len"):
        activation_rms(model, torch.zeros(1, 100, dtype=torch.long))
    assert not any(m._forward_hooks for m in model.modules())
