"""AdamW parameter groups, the cosine and WSD schedules, and OptimConfig's validation. μP, the optimizer's half: every
group's lr is the schedule's × its lr_scale; sp's groups are what they were; AdamW's hidden matrices at lr/m, Muon's
at lr/sqrt(m) — the rule that keeps Muon's update the same spectral size at every width —, lr·weight_decay kept; old
optimizer states without lr_scale, and the checkpointed state carries each group's. (Muon itself: test_muon.py.)"""

import math

import pytest
import torch

from model import ModelConfig, Transformer
from training.checkpoint import full_model_state, full_optimizer_state, load_full_state
from training.config import OptimConfig
from training.distributed import bf16_fast
from training.optim import (
    UNPLANNED_END,
    apply_schedule,
    build_optimizers,
    hidden_matrices,
    lr_at,
    param_groups,
    planned_lr_at,
    wsd_decay_start,
)


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


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_apply_schedule_follows_a_time_budgets_plans(schedule):
    """plans (RunState.plans: the step each end was planned at, and that end): the lr of planned_lr_at from an
    unplanned end, whatever max_steps says; without plans, lr_at to max_steps."""
    cfg = OptimConfig(lr=1.0, min_lr=0.1, warmup_steps=10, schedule=schedule)
    (opt,) = build_optimizers(tiny_model(), cfg, "cpu")
    plans = [{"at_step": 5, "max_steps": 400}, {"at_step": 150, "max_steps": 300}]
    ends = [(0, UNPLANNED_END), (5, 400), (150, 300)]
    for step in (0, 4, 5, 100, 149, 150, 220, 300, 350):
        lr = apply_schedule([opt], step, cfg, 1000, plans)
        assert lr == planned_lr_at(step, cfg, ends) and {g["lr"] for g in opt.param_groups} == {lr}, step
        assert apply_schedule([opt], step, cfg, 300) == lr_at(step, cfg, 300)
    assert apply_schedule([opt], 299, cfg, 1000, plans) != lr_at(299, cfg, 1000)  # the plans, not max_steps
    assert apply_schedule([opt], 300, cfg, 1000, plans) == pytest.approx(0.1)  # the planned end: min_lr


def test_fused_optimizer_matches_plain():
    torch.manual_seed(0)
    a, b = tiny_model(), tiny_model()
    b.load_state_dict(a.state_dict())
    x = torch.randint(0, 64, (2, 8))
    opts = [build_optimizers(m, OptimConfig(impl=impl), "cpu")[0] for m, impl in ((a, "fused"), (b, "plain"))]
    for _ in range(3):
        for m, opt in zip((a, b), opts):
            m(x).float().logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad()
    for (n, p), q in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)


@pytest.mark.parametrize(
    "fields, message",
    [
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
    ],
)
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


@pytest.mark.parametrize(
    "impl, device, fused, foreach",
    [
        ("auto", "cpu", True, None),
        ("auto", "cuda", True, None),
        ("auto", "mps", None, True),
        ("foreach", "cpu", None, True),
        ("plain", "cpu", None, False),
        ("fused", "cpu", True, None),
    ],
)
def test_adamw_gets_the_kernel_and_hyperparameters_asked_for(impl, device, fused, foreach):
    model = Transformer(ModelConfig(vocab_size=64, hidden_size=32, n_layers=1, n_heads=2, max_seq_len=8))
    cfg = OptimConfig(lr=2e-3, beta1=0.8, beta2=0.9, eps=1e-7, impl=impl)
    if device == "cuda":  # the choice only: building a fused CUDA optimizer needs CUDA tensors
        from training import optim

        captured = {}
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(optim.torch.optim, "AdamW", lambda groups, **kw: captured.update(kw))
            optim.build_optimizers(model, cfg, device)
        assert captured.get("fused") is fused and captured.get("foreach") is foreach
        return
    (opt,) = build_optimizers(model, cfg, device)
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


# ---- μP, the optimizer's half: each group's lr_scale ---------------------------------------------------------

SCHEDULE = dict(lr=1e-2, min_lr=1e-3, warmup_steps=3)


def mup_model(width=128, parametrization="mup", seed=0, **overrides):
    """Untied, so the head is a decayed matrix outside the blocks; base width 32: m = width / 32."""
    torch.manual_seed(seed)
    return Transformer(
        ModelConfig(
            **{
                **dict(
                    vocab_size=64,
                    hidden_size=width,
                    n_layers=2,
                    n_heads=4,
                    max_seq_len=16,
                    tie_embeddings=False,
                    parametrization=parametrization,
                    mup_base_width=32,
                ),
                **overrides,
            }
        )
    )


def lrs_by_parameter(m, optimizers) -> dict:
    names = {id(p): n for n, p in m.named_parameters()}
    return {
        names[id(p)]: (g["lr"], g["weight_decay"]) for opt in optimizers for g in opt.param_groups for p in g["params"]
    }


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_sp_groups_are_todays_with_lr_scale_one(name):
    m = mup_model(parametrization="sp")
    optimizers = build_optimizers(m, OptimConfig(name=name, **SCHEDULE), "cpu")
    assert [len(opt.param_groups) for opt in optimizers] == ([2] if name == "adamw" else [1, 2])
    assert {g["lr_scale"] for opt in optimizers for g in opt.param_groups} == {1.0}
    lr = apply_schedule(optimizers, 5, OptimConfig(name=name, **SCHEDULE), 20)
    assert {lr for lr, _ in lrs_by_parameter(m, optimizers).values()} == {lr}


@pytest.mark.parametrize("name, hidden_scale", [("adamw", 1 / 4), ("muon", 1 / 2)])
def test_mup_scales_the_blocks_matrices_only_and_the_schedule_drives_every_group(name, hidden_scale):
    m = mup_model(width=128)  # m = 4
    cfg = OptimConfig(name=name, **SCHEDULE)
    optimizers = build_optimizers(m, cfg, "cpu")
    hidden = {n for n, p in m.named_parameters() if any(p is q for q in hidden_matrices(m))}
    assert len(hidden) == 2 * 6
    for step in (0, 2, 10, 19):  # warmup, peak, decay
        lr = apply_schedule(optimizers, step, cfg, 20)
        assert lr == lr_at(step, cfg, 20)
        for param, (group_lr, decay) in lrs_by_parameter(m, optimizers).items():
            if param in hidden:  # lr·weight_decay, each step's decay, is the base width's
                assert (group_lr, decay) == (pytest.approx(lr * hidden_scale), pytest.approx(0.1 / hidden_scale))
            else:  # embedding, untied head, norm gains: width-independent
                assert (group_lr, decay) == (lr, 0.1 if param == "lm_head.weight" else 0.0), param


def _first_update(width: int, parametrization: str, name: str, param: str) -> torch.Tensor:
    m = mup_model(width=width, parametrization=parametrization)
    cfg = OptimConfig(name=name, lr=1e-2, min_lr=1e-2, warmup_steps=0, weight_decay=0.0)
    # Newton–Schulz in bf16 only where this CPU has it in hardware, as a run here does (emulated: ~100× slower)
    optimizers = build_optimizers(m, cfg, "cpu", bf16_fast(torch.device("cpu"))[0])
    weight = dict(m.named_parameters())[param]
    before = weight.detach().clone()
    g = torch.Generator().manual_seed(0)
    for p in m.parameters():
        p.grad = torch.randn(p.shape, generator=g)
    apply_schedule(optimizers, 0, cfg, 10)
    for opt in optimizers:
        opt.step()
    return weight.detach() - before


@pytest.mark.parametrize("param", ["layers.0.attn.q_proj.weight", "layers.1.mlp.gate_up_proj.weight"])
def test_muons_mup_update_has_the_same_spectral_norm_at_every_width(param):
    """μP wants ‖ΔW‖₂ = Θ(1) for the blocks' matrices (Yang, Simon & Bernstein 2023). Muon's update is
    orthogonal (singular values ≈ 1), and match_rms_adamw multiplies it by 0.2·sqrt(max(rows, cols)),
    which grows as sqrt(m): the lr's 1/sqrt(m) cancels it. Adam's 1/m here would halve it per 4× width."""
    spectral = lambda w, p: torch.linalg.matrix_norm(_first_update(w, p, "muon", param), ord=2).item()  # noqa: E731
    assert spectral(512, "mup") / spectral(128, "mup") == pytest.approx(1.0, abs=0.1)
    assert spectral(512, "sp") / spectral(128, "sp") == pytest.approx(2.0, rel=0.1)  # sp grows as sqrt(width)


def test_adamws_mup_first_update_is_lr_over_m_in_every_entry():
    """Adam's first step is lr·sign(gradient) per entry: its size is the group's lr, so μP's 1/m shows as is."""
    for width in (128, 512):
        update = _first_update(width, "mup", "adamw", "layers.0.attn.q_proj.weight")
        assert update.abs().max().item() == pytest.approx(1e-2 * 32 / width, rel=1e-4)


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_the_checkpointed_optimizer_state_carries_each_groups_lr_scale(name):
    """What a resume restores (a μP run resumed through train.py is bitwise: tests/test_mup_train.py)."""
    m, cfg = mup_model(), OptimConfig(name=name, **SCHEDULE)
    saved = full_optimizer_state(m, build_optimizers(m, cfg, "cpu"))
    optimizers = build_optimizers(m, cfg, "cpu")
    for group in (g for opt in optimizers for g in opt.param_groups):
        group["lr_scale"] = 1.0  # wrong: the saved scales must replace it
    load_full_state(m, optimizers, full_model_state(m), saved)
    assert sorted(g["lr_scale"] for opt in optimizers for g in opt.param_groups) == sorted(
        [1 / 4 if name == "adamw" else 1 / 2, 1.0, 1.0]
    )


def test_an_optimizer_state_saved_before_lr_scale_resumes_at_scale_one():
    m = mup_model(parametrization="sp")
    cfg = OptimConfig(**SCHEDULE)
    optimizers = build_optimizers(m, cfg, "cpu")
    saved = full_optimizer_state(m, optimizers)
    for group in saved["param_groups"]:
        del group["lr_scale"]  # as every checkpoint written before μP
    load_full_state(m, optimizers, full_model_state(m), saved)
    assert apply_schedule(optimizers, 7, cfg, 20) == lr_at(7, cfg, 20)
    assert {g["lr"] for g in optimizers[0].param_groups} == {lr_at(7, cfg, 20)}


@pytest.mark.parametrize("exponent, hidden_scale", [(1.0, 1 / 4), (0.5, 1 / 2), (0.0, 1.0)])
def test_the_hidden_lr_exponent_sets_adamws_mup_scale(exponent, hidden_scale):
    """optim.mup_hidden_lr_exponent (docs/mup.md's experiment): the blocks' matrices at lr × m^-exponent, m = 4."""
    m = mup_model(width=128)
    optimizers = build_optimizers(m, OptimConfig(name="adamw", mup_hidden_lr_exponent=exponent, **SCHEDULE), "cpu")
    hidden = {n for n, p in m.named_parameters() if any(p is q for q in hidden_matrices(m))}
    scales = {
        group["lr_scale"]
        for opt in optimizers
        for group in opt.param_groups
        if any(n in hidden for n, p in m.named_parameters() for q in group["params"] if p is q)
    }
    assert len(scales) == 1 and scales.pop() == pytest.approx(hidden_scale)
