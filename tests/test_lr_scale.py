"""μP, the optimizer's half (training/optim/lr_scale.py): every group's lr is the schedule's × its lr_scale;
sp's groups are what they were; AdamW's hidden matrices at lr/m, Muon's at lr/sqrt(m) — the rule that keeps
Muon's update the same spectral size at every width —, lr·weight_decay kept; old optimizer states without
lr_scale, and the checkpointed state carries each group's."""
import pytest
import torch

from model import ModelConfig, Transformer
from training.checkpoint.state_dicts import full_model_state, full_optimizer_state, load_full_state
from training.config import OptimConfig
from training.optim import apply_schedule, build_optimizers, hidden_matrices, lr_at

SCHEDULE = dict(lr=1e-2, min_lr=1e-3, warmup_steps=3)


def model(width=128, parametrization="mup", seed=0, **overrides):
    """Untied, so the head is a decayed matrix outside the blocks; base width 32: m = width / 32."""
    torch.manual_seed(seed)
    return Transformer(ModelConfig(**{**dict(vocab_size=64, hidden_size=width, n_layers=2, n_heads=4, max_seq_len=16,
                                             tie_embeddings=False, parametrization=parametrization,
                                             mup_base_width=32), **overrides}))


def lrs_by_parameter(m, optimizers) -> dict:
    names = {id(p): n for n, p in m.named_parameters()}
    return {names[id(p)]: (g["lr"], g["weight_decay"]) for opt in optimizers for g in opt.param_groups
            for p in g["params"]}


@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_sp_groups_are_todays_with_lr_scale_one(name):
    m = model(parametrization="sp")
    optimizers = build_optimizers(m, OptimConfig(name=name, **SCHEDULE), "cpu")
    assert [len(opt.param_groups) for opt in optimizers] == ([2] if name == "adamw" else [1, 2])
    assert {g["lr_scale"] for opt in optimizers for g in opt.param_groups} == {1.0}
    lr = apply_schedule(optimizers, 5, OptimConfig(name=name, **SCHEDULE), 20)
    assert {lr for lr, _ in lrs_by_parameter(m, optimizers).values()} == {lr}


@pytest.mark.parametrize("name, hidden_scale", [("adamw", 1 / 4), ("muon", 1 / 2)])
def test_mup_scales_the_blocks_matrices_only_and_the_schedule_drives_every_group(name, hidden_scale):
    m = model(width=128)  # m = 4
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
    m = model(width=width, parametrization=parametrization)
    cfg = OptimConfig(name=name, lr=1e-2, min_lr=1e-2, warmup_steps=0, weight_decay=0.0)
    optimizers = build_optimizers(m, cfg, "cpu")
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
    m, cfg = model(), OptimConfig(name=name, **SCHEDULE)
    saved = full_optimizer_state(m, build_optimizers(m, cfg, "cpu"))
    optimizers = build_optimizers(m, cfg, "cpu")
    for group in (g for opt in optimizers for g in opt.param_groups):
        group["lr_scale"] = 1.0  # wrong: the saved scales must replace it
    load_full_state(m, optimizers, full_model_state(m), saved)
    assert sorted(g["lr_scale"] for opt in optimizers for g in opt.param_groups) == \
        sorted([1 / 4 if name == "adamw" else 1 / 2, 1.0, 1.0])


def test_an_optimizer_state_saved_before_lr_scale_resumes_at_scale_one():
    m = model(parametrization="sp")
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
    m = model(width=128)
    optimizers = build_optimizers(m, OptimConfig(name="adamw", mup_hidden_lr_exponent=exponent, **SCHEDULE), "cpu")
    hidden = {n for n, p in m.named_parameters() if any(p is q for q in hidden_matrices(m))}
    scales = {group["lr_scale"] for opt in optimizers for group in opt.param_groups
              if any(n in hidden for n, p in m.named_parameters() for q in group["params"] if p is q)}
    assert len(scales) == 1 and scales.pop() == pytest.approx(hidden_scale)
