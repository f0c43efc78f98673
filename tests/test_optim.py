"""AdamW parameter groups, the cosine and WSD schedules, and OptimConfig's validation."""
import math

import pytest
import torch

from model import ModelConfig, Transformer
from training.config import OptimConfig
from training.optim import apply_schedule, build_optimizer, build_optimizers, lr_at, param_groups, wsd_decay_start


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


def test_adamw_is_one_optimizer_over_every_parameter():
    model = tiny_model()
    (opt,) = build_optimizers(model, OptimConfig(), "cpu")
    assert isinstance(opt, torch.optim.AdamW)
    assert {id(p) for g in opt.param_groups for p in g["params"]} == {id(p) for p in model.parameters()}


def test_cosine_warmup_peak_and_floor():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10)
    lrs = [lr_at(s, cfg, 110) for s in range(111)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))  # warmup increases
    assert all(a >= b for a, b in zip(lrs[10:], lrs[11:]))  # then decays monotonically
    assert lrs[60] == pytest.approx(0.1 + 0.5 * (1 + math.cos(math.pi * 0.5)) * 0.9)
    assert lrs[110] == pytest.approx(0.1)


def test_wsd_values_at_the_phase_boundaries():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, schedule="wsd", decay_fraction=0.2)
    # 110 steps: 22 of decay, starting at step 88.
    assert wsd_decay_start(cfg, 110) == 88
    assert lr_at(0, cfg, 110) == pytest.approx(0.1)  # warmup exactly as cosine's
    assert lr_at(9, cfg, 110) == 1.0
    assert all(lr_at(s, cfg, 110) == 1.0 for s in range(10, 89))  # stable, the decay's first step included
    assert lr_at(89, cfg, 110) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(1 / 22)))
    assert lr_at(99, cfg, 110) == pytest.approx(0.1 + 0.9 * (1 - math.sqrt(11 / 22)))
    assert lr_at(110, cfg, 110) == pytest.approx(0.1)
    lrs = [lr_at(s, cfg, 110) for s in range(88, 111)]
    assert all(a > b for a, b in zip(lrs, lrs[1:]))


def test_wsd_decay_never_starts_inside_warmup():
    cfg = OptimConfig(lr=1.0, min_lr=0.0, warmup_steps=10, schedule="wsd", decay_fraction=1.0)
    assert wsd_decay_start(cfg, 20) == 10
    assert lr_at(9, cfg, 20) == 1.0 and lr_at(15, cfg, 20) == pytest.approx(1 - math.sqrt(0.5))


@pytest.mark.parametrize("schedule, jumps", [("wsd", False), ("cosine", True)])
def test_extending_a_run_on_resume_jumps_the_lr_only_with_cosine(schedule, jumps):
    """Stopped at step 500 of 1000 and resumed with trainer.max_steps=2000: the lr of the first
    resumed step against the last step before the stop."""
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, schedule=schedule)
    before, after = lr_at(499, cfg, 1000), lr_at(500, cfg, 2000)
    continued = lr_at(500, cfg, 1000)
    if jumps:
        assert after - before > 0.3 and abs(continued - before) < 0.01
    else:
        assert before == after == continued == 1.0


def test_cosine_is_unchanged_by_wsd_fields():
    base, other = OptimConfig(lr=1.0, min_lr=0.1), OptimConfig(lr=1.0, min_lr=0.1, decay_fraction=0.5)
    assert [lr_at(s, base, 300) for s in range(301)] == [lr_at(s, other, 300) for s in range(301)]


def test_apply_schedule_sets_every_group_and_returns_the_lr():
    opts = build_optimizers(tiny_model(), OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10), "cpu")
    lr = apply_schedule(opts, 5, OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10), 100)
    assert lr == pytest.approx(0.6)
    assert all(g["lr"] == lr for opt in opts for g in opt.param_groups)


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


@pytest.mark.parametrize("fields, message", [
    ({"lr": 0.0}, "optim.lr=0.0 must be > 0"),
    ({"lr": -1e-3}, "optim.lr=-0.001 must be > 0"),
    ({"lr": 1e-3, "min_lr": 2e-3}, "optim.min_lr=0.002 must be between 0 and optim.lr=0.001"),
    ({"min_lr": -1.0}, "optim.min_lr=-1.0 must be between 0"),
    ({"warmup_steps": -1}, "optim.warmup_steps=-1 must be >= 0"),
    ({"grad_clip": -0.5}, "optim.grad_clip=-0.5 must be >= 0"),
    ({"weight_decay": -0.1}, "optim.weight_decay=-0.1 must be >= 0"),
    ({"name": "sgd"}, "optim.name='sgd' is unknown; choose adamw or muon"),
    ({"schedule": "linear"}, "optim.schedule='linear' is unknown; choose cosine or wsd"),
    ({"impl": "fast"}, "optim.impl='fast' is unknown"),
    ({"decay_fraction": 0.0}, r"optim.decay_fraction=0.0 must be in \(0, 1\]"),
    ({"decay_fraction": 1.5}, r"optim.decay_fraction=1.5 must be in \(0, 1\]"),
    ({"beta2": 1.0}, r"optim.beta2=1.0 must be in \[0, 1\)"),
    ({"muon_lr": 0.0}, "optim.muon_lr=0.0 must be > 0, or null"),
    ({"muon_ns_dtype": "fp16"}, "optim.muon_ns_dtype='fp16' is unknown"),
    ({"muon_ns_stack_mb": -1}, "optim.muon_ns_stack_mb=-1 must be >= 0"),
])
def test_bad_values_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        OptimConfig(**fields)


def test_bad_value_fails_at_composition_through_omegaconf():
    """train.py builds the dataclasses with OmegaConf.to_object, which runs __post_init__."""
    from omegaconf import OmegaConf
    with pytest.raises(ValueError, match="optim.decay_fraction=2.0"):
        OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OptimConfig), {"decay_fraction": 2}))


def test_wsd_decays_over_at_least_one_step_and_ends_at_min_lr_after_the_end():
    # 1 % of 10 steps rounds to no step: the decay still takes one, the last step, and lands on min_lr.
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=2, schedule="wsd", decay_fraction=0.01)
    assert wsd_decay_start(cfg, 10) == 9
    assert [lr_at(s, cfg, 10) for s in (8, 9, 10)] == [1.0, 1.0, pytest.approx(0.1)]
    assert lr_at(25, cfg, 10) == pytest.approx(0.1)  # past max_steps (a resumed run's extra steps): the floor


def test_cosine_reaches_min_lr_at_the_end_and_stays_there():
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=9)
    assert lr_at(10, cfg, 10) == pytest.approx(0.1)  # one step after warmup: the whole cosine in that step
    assert lr_at(60, cfg, 10) == pytest.approx(0.1)  # past max_steps: the floor, not back up the cosine


def test_apply_schedule_after_warmup_follows_lr_at():
    model = Transformer(ModelConfig(vocab_size=64, hidden_size=32, n_layers=1, n_heads=2, max_seq_len=8))
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=2)
    (opt,) = build_optimizers(model, cfg, "cpu")
    assert apply_schedule([opt], 7, cfg, 10) == lr_at(7, cfg, 10) < 1.0
    assert {g["lr"] for g in opt.param_groups} == {lr_at(7, cfg, 10)}


@pytest.mark.parametrize("impl, device, fused, foreach", [("auto", "cpu", True, None), ("auto", "cuda", True, None),
                                                          ("auto", "mps", None, True), ("foreach", "cpu", None, True),
                                                          ("plain", "cpu", None, False), ("fused", "cpu", True, None)])
def test_adamw_gets_the_kernel_and_hyperparameters_asked_for(impl, device, fused, foreach):
    model = Transformer(ModelConfig(vocab_size=64, hidden_size=32, n_layers=1, n_heads=2, max_seq_len=8))
    cfg = OptimConfig(lr=2e-3, beta1=0.8, beta2=0.9, eps=1e-7, impl=impl)
    if device == "cuda":  # the choice only: building a fused CUDA optimizer needs CUDA tensors
        from training import optim
        captured = {}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(optim.torch.optim, "AdamW", lambda groups, **kw: captured.update(kw))
            optim.build_optimizer(model, cfg, device)
        assert captured.get("fused") is fused and captured.get("foreach") is foreach
        return
    opt = build_optimizer(model, cfg, device)
    d = opt.defaults
    assert (d["fused"], d["foreach"]) == (fused, foreach)
    assert (d["lr"], d["betas"], d["eps"]) == (2e-3, (0.8, 0.9), 1e-7)


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_build_optimizers_hands_the_device_to_adamws_kernel_choice(name):
    adamw = build_optimizers(tiny_model(), OptimConfig(name=name), "cpu")[-1]
    assert adamw.defaults["fused"] is True  # fused on CPU; an unknown device would get foreach


def test_frozen_parameters_are_left_out_and_only_they():
    model = tiny_model(norm="layernorm")
    model.norm.weight.requires_grad_(False)  # the final LayerNorm's gain, before its bias
    groups = param_groups(model, 0.1)
    grouped = {id(p) for group in groups for p in group["params"]}
    assert id(model.norm.weight) not in grouped and id(model.norm.bias) in grouped
    assert len(grouped) == len([p for p in model.parameters() if p.requires_grad])


def test_a_matrix_shared_by_two_blocks_is_one_muon_parameter():
    from training.optim import hidden_matrices
    model = tiny_model()
    model.layers[1].mlp.down_proj = model.layers[0].mlp.down_proj  # weight sharing across depth
    matrices = hidden_matrices(model)
    assert len(matrices) == len({id(m) for m in matrices}) == 2 * 6 - 1  # q, k, v, o, gate_up, down per block
    assert sum(m is model.layers[0].mlp.down_proj.weight for m in matrices) == 1
    build_optimizers(model, OptimConfig(name="muon"), "cpu")  # torch refuses a parameter listed twice


def test_wsd_decay_length_rounds_to_the_nearest_step():
    """decay_fraction·max_steps that is not a whole number rounds to the nearest step (half up), never down:
    0.25·110 = 27.5 → 28 steps of decay, from step 82; 0.3·110 = 33 exactly; 0.15·110 = 16.5 → 17."""
    for fraction, start in ((0.25, 82), (0.3, 77), (0.15, 93), (0.19, 89)):  # 0.19·110 = 20.9 → 21
        cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, schedule="wsd", decay_fraction=fraction)
        assert wsd_decay_start(cfg, 110) == start, fraction
