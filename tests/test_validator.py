"""activation_rms: per-layer RMS from hooks equals the RMS of the block outputs (and attention logits) computed by
hand; weight_change equals the relative change between two checkpoints of a real run."""

import json
import math

import pytest
import torch

from model import Transformer
from tests.model_helpers import one_thread, random_transformer, tiny_model_config
from training.loop import activation_rms


def rms64(t: torch.Tensor) -> float:
    """sqrt(mean(x²)) over every element, in float64."""
    return math.sqrt(t.double().pow(2).mean().item())


def manual_block_rms(model: Transformer, input_ids: torch.Tensor) -> dict:
    """Runs the blocks one by one, as Transformer.forward does, and measures each stage."""
    T = input_ids.shape[1]
    cos, sin = model.rope_cos[:T], model.rope_sin[:T]
    x = model.embed_tokens(input_ids)
    out = {"residual": [], "attn_in": [], "mlp_in": [], "attn_logits": []}
    for block in model.layers:
        attn_in = block.attn_norm(x)
        out["attn_logits"].append(rms64(manual_attention_logits(block.attn, attn_in[:1], cos, sin)))
        mid = x + block.attn(attn_in, cos, sin)
        mlp_in = block.mlp_norm(mid)
        x = mid + block.mlp(mlp_in)
        for name, t in (("residual", x), ("attn_in", attn_in), ("mlp_in", mlp_in)):
            out[name].append(rms64(t))
    return out


def manual_attention_logits(attn, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Scores q·kᵀ × scale of one sequence x (1, T, D), every head, at the causal positions: RoPE written out as
    the rotation of each (first half, second half) pair, GQA as each query head's kv head, in float64."""
    B, T, _ = x.shape
    hd, H, Hkv = attn.head_dim, attn.n_heads, attn.n_kv_heads
    q = attn.q_norm(attn.q_proj(x).view(B, T, H, hd)).double()
    k = attn.k_norm(attn.k_proj(x).view(B, T, Hkv, hd)).double()
    c, s = cos.double()[None, :, None, :], sin.double()[None, :, None, :]

    def rotate(t):
        half = hd // 2
        return t * c + torch.cat([-t[..., half:], t[..., :half]], dim=-1) * s

    q, k = rotate(q), rotate(k)
    scale = attn.scale if attn.scale is not None else 1 / math.sqrt(hd)
    entries = [
        float(q[0, i, h] @ k[0, j, h * Hkv // H]) * scale for h in range(H) for i in range(T) for j in range(i + 1)
    ]
    return torch.tensor(entries, dtype=torch.float64)


@pytest.mark.parametrize(
    "norm, mlp, n_kv_heads, qk_norm", [("rmsnorm", "swiglu", 2, False), ("layernorm", "gelu", 1, True)]
)
def test_hooked_rms_equals_direct_computation(norm, mlp, n_kv_heads, qk_norm):
    with one_thread(), torch.no_grad():
        model = random_transformer(
            tiny_model_config(norm=norm, mlp=mlp, n_layers=3, n_kv_heads=n_kv_heads, qk_norm=qk_norm)
        )
        input_ids = torch.randint(0, 61, (3, 20), generator=torch.Generator().manual_seed(0))
        stats = activation_rms(model, input_ids)
        expected = manual_block_rms(model, input_ids)
    for name in ("residual", "attn_in", "mlp_in", "attn_logits"):
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


@pytest.mark.serial  # trains
def test_weight_change_is_each_blocks_relative_move_between_two_evaluations(tmp_path, tiny_data_cache):
    """trainer.weight_change=true: the eval row at step 4 holds, per block, |W4 - W2| / |W2| over the block's
    matrices, W2 and W4 the checkpoints written at those evaluations; an FSDP run refuses it in one line."""
    from safetensors.torch import load_file

    from tests.train_helpers import train_in_process
    from training.config import TrainerConfig

    run = tmp_path / "run"
    train_in_process(
        run,
        "trainer.max_steps=4",
        "trainer.eval_interval=2",
        "trainer.ckpt_interval=2",
        "trainer.keep_last=2",
        "trainer.weight_change=true",
        cache_dir=tiny_data_cache,
    )
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in rows if r["kind"] == "eval"}
    w2, w4 = (load_file(run / "checkpoints" / f"step_{s:07d}" / "model.safetensors") for s in (2, 4))
    layers = sorted({int(k.split(".")[1]) for k in w2 if k.startswith("layers.")})
    expected = []
    for i in layers:
        names = [k for k in w2 if k.startswith(f"layers.{i}.") and w2[k].ndim >= 2]
        before, after = (torch.cat([w[k].double().flatten() for k in names]) for w in (w2, w4))
        expected.append(float((after - before).norm() / before.norm()))
    assert len(evals[2]["weight_change"]) == len(layers) == len(evals[4]["weight_change"])
    assert evals[4]["weight_change"] == pytest.approx(expected, rel=1e-5)
    assert all(v > 0 for v in expected)
    assert len(evals[4]["rms_attn_logits"]) == len(layers)
    with pytest.raises(ValueError, match=r"trainer.weight_change=true needs whole weights on each rank"):
        TrainerConfig(weight_change=True, parallel="fsdp")
