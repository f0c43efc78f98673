"""The full model: every norm × mlp variant trains under bf16 autocast; tying, init, parameter and FLOP accounting."""
import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from model import MLPS, NORMS, ModelConfig, Transformer
from model_helpers import one_thread, tiny_model_config


@pytest.mark.parametrize("norm, mlp", list(itertools.product(NORMS, MLPS)))
def test_variant_trains_under_bf16_autocast_and_overfits_one_batch(norm, mlp):
    cfg = tiny_model_config(norm=norm, mlp=mlp, max_seq_len=16)
    torch.manual_seed(0)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randint(0, cfg.vocab_size, (2, 17))
    inputs, targets = batch[:, :-1], batch[:, 1:]
    losses = []
    with one_thread():
        for step in range(50):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(inputs)
            assert logits.shape == (2, 16, cfg.vocab_size) and logits.dtype == torch.bfloat16
            loss = F.cross_entropy(logits.float().reshape(-1, cfg.vocab_size), targets.reshape(-1))
            loss.backward()
            if step == 0:
                for name, p in model.named_parameters():
                    assert p.grad is not None and torch.isfinite(p.grad).all(), name
                    assert p.grad.abs().sum() > 0, f"{name} gets no gradient"
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    assert math.isclose(losses[0], math.log(cfg.vocab_size), rel_tol=0.1)  # a fresh model guesses uniformly
    assert losses[-1] < 0.2, f"{norm}/{mlp} did not memorise 32 tokens: {losses[0]:.2f} → {losses[-1]:.2f}"


def test_forward_returns_logits_and_rejects_too_long_input():
    cfg = tiny_model_config()
    model = Transformer(cfg)
    out = model(torch.zeros(3, 5, dtype=torch.long))
    assert isinstance(out, torch.Tensor) and out.shape == (3, 5, cfg.vocab_size)
    with pytest.raises(ValueError, match="max_seq_len"):
        model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))


def test_tied_embeddings_share_storage():
    tied = Transformer(tiny_model_config(tie_embeddings=True))
    assert tied.lm_head.weight is tied.embed_tokens.weight
    with torch.no_grad():
        tied.embed_tokens.weight[3, 0] = 123.0
    assert tied.lm_head.weight[3, 0] == 123.0
    untied = Transformer(tiny_model_config(tie_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.embed_tokens.weight.data_ptr()


def test_init_scales_residual_projections_by_depth():
    cfg = ModelConfig(vocab_size=512, hidden_size=128, n_layers=8, n_heads=4, max_seq_len=8, init_std=0.05)
    torch.manual_seed(0)
    with one_thread():
        model = Transformer(cfg)
    residual_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, p in model.named_parameters():
        if p.dim() < 2:
            assert torch.equal(p, torch.ones_like(p)), f"norm weight {name} should start at ones"
            continue
        expected = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else cfg.init_std
        assert p.std().item() == pytest.approx(expected, rel=0.04), name  # ≥ 16k samples: ~0.6 % noise
        assert abs(p.mean().item()) < 0.1 * expected, name


def test_layernorm_biases_start_at_zero():
    model = Transformer(tiny_model_config(norm="layernorm"))
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    assert len(biases) == 2 * model.cfg.n_layers + 1 and all(torch.equal(b, torch.zeros_like(b)) for b in biases)


def expected_counts(cfg: ModelConfig) -> dict:
    d, hd, L = cfg.hidden_size, cfg.head_dim, cfg.n_layers
    gated = cfg.mlp in ("swiglu", "geglu")
    return {
        "embedding": cfg.vocab_size * d,
        "attention": L * (2 * d * cfg.n_heads * hd + 2 * d * cfg.n_kv_heads * hd),  # q, o; k, v
        "mlp": L * (3 if gated else 2) * d * cfg.intermediate_size,
        "norm": (2 * L + 1) * d * (2 if cfg.norm == "layernorm" else 1),
        "lm_head": 0 if cfg.tie_embeddings else cfg.vocab_size * d,
    }


@pytest.mark.parametrize("overrides", [
    {}, {"tie_embeddings": False}, {"norm": "layernorm", "mlp": "gelu"}, {"mlp": "geglu", "n_kv_heads": 1},
])
def test_param_counts_match_formulas_and_add_up(overrides):
    model = Transformer(tiny_model_config(**overrides))
    counts = model.param_counts()
    assert counts == {**expected_counts(model.cfg), "total": counts["total"]}
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_param_count_of_llama_7b():
    # Meta's published 7B shape must come to its well-known 6,738,415,616 parameters.
    cfg = ModelConfig(vocab_size=32000, hidden_size=4096, n_layers=32, n_heads=32, multiple_of=256,
                      max_seq_len=2048, norm_eps=1e-6, tie_embeddings=False)
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = Transformer(cfg)
    assert model.param_counts()["total"] == 6_738_415_616


def test_flops_per_token():
    cfg = ModelConfig()  # the CPU default: 4096 vocab, d 256, 6 layers, I 704
    model = Transformer(cfg)
    d, L, V, I = 256, 6, 4096, 704
    n_matmul = L * (4 * d * d + 3 * d * I) + V * d  # attention, MLP, and the (tied) LM head's matmul
    assert model.flops_per_token(256) == 6 * n_matmul + 12 * L * d * 256
    assert model.flops_per_token() == model.flops_per_token(cfg.max_seq_len)
    # The attention term grows with context; the weight term does not.
    assert model.flops_per_token(512) - model.flops_per_token(256) == 12 * L * d * 256


def test_meta_device_init_then_to_empty_matches_a_normal_build():
    """Large-model init: shapes on `meta`, memory with to_empty(), values from init_weights()."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16)
    with torch.device("meta"):
        lazy = Transformer(cfg)
    lazy = lazy.to_empty(device="cpu")
    lazy.init_weights()
    eager = Transformer(cfg)
    assert torch.equal(lazy.rope_cos, eager.rope_cos) and torch.equal(lazy.rope_sin, eager.rope_sin)
    assert all(torch.isfinite(p).all() for p in lazy.parameters())
    assert lazy.lm_head.weight is lazy.embed_tokens.weight
