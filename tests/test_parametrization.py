"""μP, the model's half (model/parametrization.py): sp stays the default and what old checkpoints load as;
at the base width mup is sp; the float64 reference with its attention scale and output multiplier; init
that scales only the blocks' matrices; every path to logits multiplied; a folded sp copy computes the
same logits; FLOPs and parameter counts unchanged."""
import dataclasses
import json
import math

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, Transformer
from model.generate import generate_ids
from model.parametrization import as_standard, attention_scale, width_multiplier
from model_helpers import one_thread, random_transformer, reference_forward, tiny_model_config
from training.loss import CausalLMLoss


@pytest.fixture(autouse=True)
def single_thread():
    with one_thread():
        yield


def mup_config(**overrides) -> ModelConfig:
    """hidden 32 over base 16: m = 2, head_dim 8 over a base head_dim of 4."""
    return tiny_model_config(**{"parametrization": "mup", "mup_base_width": 16, **overrides})


def test_sp_is_the_default_and_model_configs_without_the_fields_load_as_sp():
    assert (ModelConfig().parametrization, ModelConfig().mup_base_width) == ("sp", 256)
    saved = dataclasses.asdict(tiny_model_config())
    del saved["parametrization"], saved["mup_base_width"]  # a model_config.json written before μP
    assert ModelConfig.from_dict(saved) == tiny_model_config()
    cfg = mup_config()
    assert ModelConfig.from_dict(json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg  # checkpoints carry them


@pytest.mark.parametrize("overrides, message", [
    (dict(parametrization="muP"), "model.parametrization='muP' is unknown; choose one of ['sp', 'mup']"),
    (dict(mup_base_width=0), "model.mup_base_width=0 must be a positive integer"),
    (dict(mup_base_width=-64), "model.mup_base_width=-64 must be a positive integer"),
    (dict(mup_attention_scale="1/d"), "model.mup_attention_scale='1/d' is unknown; choose mup (sqrt(d0)/d) or sp"),
])
def test_bad_values_are_one_line_errors_naming_the_field(overrides, message):
    with pytest.raises(ValueError) as raised:
        tiny_model_config(**overrides)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_at_the_base_width_mup_is_sp():
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    sp = Transformer(tiny_model_config())
    torch.manual_seed(0)
    mup = Transformer(mup_config(mup_base_width=32))
    assert all(torch.equal(a, b) for a, b in zip(sp.state_dict().values(), mup.state_dict().values()))
    torch.testing.assert_close(mup(ids), sp(ids), rtol=0, atol=1e-6)


@pytest.mark.parametrize("overrides", [dict(), dict(tie_embeddings=False),
                                       dict(n_kv_heads=3, hidden_size=48, n_heads=6)])
def test_forward_matches_the_float64_reference_with_mups_scales(overrides):
    model = random_transformer(mup_config(**overrides))
    assert width_multiplier(model.cfg) != 1 and attention_scale(model.cfg) != 1 / math.sqrt(model.cfg.head_dim)
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids).double()
    torch.testing.assert_close(ours, reference_forward(model, ids), rtol=0, atol=1e-5)
    as_if_sp = reference_forward(random_transformer(dataclasses.replace(model.cfg, parametrization="sp")), ids)
    assert (ours - as_if_sp).abs().max() > 1e-2  # the scales matter: sp's math is measurably other


def test_init_scales_the_blocks_matrices_by_one_over_sqrt_m_and_nothing_else():
    def stds(width, parametrization):
        torch.manual_seed(0)
        model = Transformer(ModelConfig(vocab_size=512, hidden_size=width, n_layers=2, n_heads=4, tie_embeddings=False,
                                        parametrization=parametrization, mup_base_width=64))
        std = lambda p: p.detach().std().item()  # noqa: E731
        return (std(model.layers[0].attn.q_proj.weight), std(model.layers[1].mlp.gate_up_proj.weight),
                std(model.layers[0].attn.o_proj.weight) * math.sqrt(4), std(model.embed_tokens.weight),
                std(model.lm_head.weight), model.layers[0].attn_norm.weight.mean().item())
    q, gate_up, o_depth_undone, embedding, head, gain = stds(256, "mup")  # m = 4
    assert q == pytest.approx(0.01, rel=0.03) and gate_up == pytest.approx(0.01, rel=0.03)
    assert o_depth_undone == pytest.approx(0.01, rel=0.03)  # the depth scaling on top: 1/sqrt(2·n_layers)
    assert embedding == pytest.approx(0.02, rel=0.03) and head == pytest.approx(0.02, rel=0.03) and gain == 1.0
    assert stds(256, "sp")[:2] == pytest.approx((0.02, 0.02), rel=0.03)


@pytest.mark.parametrize("tie", [True, False])
def test_every_path_to_logits_gets_the_output_multiplier(tie):
    model = random_transformer(mup_config(tie_embeddings=tie))
    ids = torch.randint(0, 61, (3, 17), generator=torch.Generator().manual_seed(2))
    x, y = ids[:, :-1], ids[:, 1:]
    logits = model(x)
    with torch.no_grad():
        torch.testing.assert_close(logits, model.lm_head(model.hidden_states(x)) / 2, rtol=0, atol=1e-6)
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    one_shot = CausalLMLoss(model, chunk_above=None)(x, y)
    chunked = CausalLMLoss(model, chunk_above=0, chunk_elements=61 * 5)(x, y)  # 5 tokens a chunk
    torch.testing.assert_close(one_shot, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked, expected, rtol=0, atol=1e-6)
    cache = model.new_kv_cache(3)
    with torch.no_grad():
        model(x[:, :9], cache)
        cached_step = model(x[:, 9:10], cache)[:, -1]  # what KV-cached generation reads
    torch.testing.assert_close(cached_step, logits[:, 9].detach(), rtol=0, atol=1e-5)
    greedy = generate_ids(model, [ids[0, :9].tolist()], 6, temperature=0)
    assert greedy == generate_ids(model, [ids[0, :9].tolist()], 6, temperature=0, use_cache=False)
    assert greedy[0][0] == int(logits[0, 8, :61].argmax())  # padding ids are never generated


@pytest.mark.parametrize("overrides", [dict(), dict(tie_embeddings=False), dict(n_kv_heads=1),
                                       dict(mup_attention_scale="sp")])
def test_the_folded_sp_model_computes_the_same_logits(overrides):
    model = random_transformer(mup_config(**overrides))
    sp_cfg, state = as_standard(model.cfg, model.state_dict())
    assert (sp_cfg.parametrization, sp_cfg.tie_embeddings) == ("sp", False)
    assert torch.equal(state["embed_tokens.weight"], model.embed_tokens.weight)  # the input side is untouched
    folded = Transformer(sp_cfg)
    folded.load_state_dict(state)
    ids = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(folded(ids), model(ids), rtol=0, atol=1e-5)
    assert as_standard(tiny_model_config(), state) == (tiny_model_config(), state)  # sp: nothing to fold


def test_flops_and_parameter_counts_do_not_depend_on_the_parametrization():
    with torch.device("meta"):
        sp, mup = Transformer(tiny_model_config()), Transformer(mup_config())
    assert sp.param_counts() == mup.param_counts()
    assert sp.flops_per_token() == mup.flops_per_token()


def test_the_attention_scale_arm_keeps_every_other_mup_scale():
    """model.mup_attention_scale=sp (docs/mup.md's experiment): SDPA's 1/sqrt(d) under mup, the float64 reference
    agrees, and the rest of μP (init, output multiplier) is what mup_config gives."""
    cfg = mup_config(mup_attention_scale="sp")
    assert attention_scale(cfg) is None and attention_scale(mup_config()) is not None
    model = random_transformer(cfg)
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).double(), reference_forward(model, ids), rtol=0, atol=1e-5)


def test_zero_query_init_zeroes_only_the_query_projection():
    """Every score is 0 at init (uniform attention); k, v and every other weight are the draws of the same seed."""
    torch.manual_seed(0)
    plain = Transformer(mup_config())
    torch.manual_seed(0)
    zero_q = Transformer(mup_config(zero_query_init=True))
    for (name, a), b in zip(plain.state_dict().items(), zero_q.state_dict().values()):
        if name.endswith("q_proj.weight"):
            assert a.abs().sum() > 0 and not b.any(), name
        else:
            assert torch.equal(a, b), name
