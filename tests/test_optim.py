"""AdamW parameter groups and the warmup + cosine schedule."""
import math

import pytest
import torch

from model import ModelConfig, Transformer
from training.config import OptimConfig
from training.optim import build_optimizer, lr_at, param_groups


def tiny_model(**kw):
    return Transformer(ModelConfig(vocab_size=64, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16, **kw))


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_decay_only_on_linear_matrices(norm):
    model = tiny_model(norm=norm)
    decay, no_decay = param_groups(model, 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert all(n.endswith("_proj.weight") for n in decay_names)
    assert "embed_tokens.weight" in no_decay_names  # also the tied head, counted once
    assert all(("norm" in n) or n == "embed_tokens.weight" for n in no_decay_names)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0


def test_untied_head_is_decayed_like_any_linear():
    model = tiny_model(tie_embeddings=False)
    decay, _ = param_groups(model, 0.1)
    assert any(p is model.lm_head.weight for p in decay["params"])


def test_schedule_warmup_peak_and_cosine_floor():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    lrs = [lr_at(s, cfg, 110) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # warmup increases
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decays monotonically
    assert lrs[60] == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 0.9)
    assert lrs[110] == pytest.approx(0.1)


def test_fused_optimizer_matches_plain():
    torch.manual_seed(0)
    a, b = tiny_model(), tiny_model()
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 64, (2, 8))
    opts = [build_optimizer(m, OptimConfig(impl=impl), "cpu") for m, impl in ((a, "fused"), (b, "plain"))]
    for _ in range(3):
        for m, opt in zip((a, b), opts):
            m(x).float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)


def test_unknown_impl_is_a_clear_error():
    with pytest.raises(ValueError, match="optim.impl='fast' is unknown"):
        build_optimizer(tiny_model(), OptimConfig(impl="fast"), "cpu")
