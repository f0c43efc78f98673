"""ModelConfig: derived fields that stay derived, padded vocabularies, a lossless JSON round trip,
errors that name the field; μP's config half (sp the default, what old checkpoints load as; the multipliers)."""

import dataclasses
import json
import math

import pytest
from model_helpers import tiny_model_config

from model import ModelConfig, find_multiple, swiglu_intermediate_size
from model.config import PARAMETRIZATIONS


def test_derived_fields_resolve_to_numbers():
    cfg = ModelConfig(hidden_size=256, n_heads=8, multiple_of=32)
    assert (cfg.resolved_n_kv_heads, cfg.resolved_intermediate_size, cfg.head_dim) == (8, 704, 32)
    assert cfg.n_kv_heads is None and cfg.intermediate_size is None  # the fields keep what the user set
    assert ModelConfig(hidden_size=4096, n_heads=32, multiple_of=256).resolved_intermediate_size == 11008
    assert (
        ModelConfig(hidden_size=256, ffn_dim_multiplier=1.5).resolved_intermediate_size
        == swiglu_intermediate_size(256, 32, 1.5)
        == 1024
    )
    assert ModelConfig(n_kv_heads=2).resolved_n_kv_heads == 2


def test_two_matrix_mlps_default_to_4d_and_explicit_size_wins():
    assert ModelConfig(hidden_size=256, mlp="gelu").resolved_intermediate_size == 1024
    assert ModelConfig(hidden_size=256, mlp="relu2").resolved_intermediate_size == 1024
    assert ModelConfig(hidden_size=256, mlp="geglu").resolved_intermediate_size == 704
    assert ModelConfig(hidden_size=256, intermediate_size=500).resolved_intermediate_size == 500


def test_replace_rederives_what_was_derived():
    """The old behaviour: __post_init__ wrote the resolved 704 / 8 into the fields, so replace() kept them."""
    cfg = ModelConfig(hidden_size=256, n_heads=8, multiple_of=32, vocab_size=4000)
    wider = dataclasses.replace(cfg, hidden_size=512)
    assert wider.resolved_intermediate_size == swiglu_intermediate_size(512, 32) == 1376
    assert wider.head_dim == 64
    fewer_heads = dataclasses.replace(cfg, n_heads=4)
    assert fewer_heads.resolved_n_kv_heads == 4  # was 8: "must divide n_heads=4" would even have failed
    assert dataclasses.replace(cfg, mlp="gelu").resolved_intermediate_size == 1024
    assert dataclasses.replace(cfg, vocab_size=50257).padded_vocab_size == 50304
    assert dataclasses.replace(cfg, vocab_multiple=128).padded_vocab_size == 4096


def test_replace_keeps_what_was_explicit():
    cfg = ModelConfig(hidden_size=256, n_heads=8, n_kv_heads=2, intermediate_size=600)
    wider = dataclasses.replace(cfg, hidden_size=512, n_heads=16)
    assert (wider.resolved_n_kv_heads, wider.resolved_intermediate_size) == (2, 600)
    back_to_auto = dataclasses.replace(cfg, intermediate_size=None, n_kv_heads=None)
    assert (back_to_auto.resolved_n_kv_heads, back_to_auto.resolved_intermediate_size) == (8, 704)


@pytest.mark.parametrize("n_layers, depth", [(1, "1 layer"), (2, "2 layers"), (32, "32 layers")])
def test_depth_reads_as_english(n_layers, depth):
    assert ModelConfig(vocab_size=64, hidden_size=32, n_layers=n_layers, n_heads=4).depth == depth


@pytest.mark.parametrize(
    "vocab_size, multiple, padded",
    [
        (4096, 64, 4096),
        (512, 64, 512),  # today's vocabularies are unchanged by the default
        (50257, 64, 50304),  # GPT-2's, as nanoGPT pads it
        (300, 64, 320),
        (61, 64, 64),
        (1, 64, 64),
        (32000, 64, 32000),
        (50257, 1, 50257),
        (300, 7, 301),
    ],
)
def test_padded_vocab_size_rounds_up_to_the_multiple(vocab_size, multiple, padded):
    assert ModelConfig(vocab_size=vocab_size, vocab_multiple=multiple).padded_vocab_size == padded
    assert ModelConfig().vocab_multiple == 64


def test_find_multiple_rounds_up_never_down():
    for k in (1, 3, 64, 256):
        for n in range(1, 600):
            m = find_multiple(n, k)
            assert m % k == 0 and n <= m < n + k, (n, k)
    with pytest.raises(ValueError, match="must be > 0"):
        find_multiple(10, 0)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"n_kv_heads": 2, "ffn_dim_multiplier": 1.3, "tie_embeddings": False, "vocab_size": 50257},
        {"norm": "layernorm", "mlp": "gelu", "intermediate_size": 300, "rope_theta": 5e5, "dropout": 0.1},
        {"norm": "none", "qk_norm": True, "vocab_multiple": 128},
        {"norm": "rmsnorm_bf16"},
    ],
)
def test_round_trip_through_json(fields):
    cfg = ModelConfig(**fields)
    data = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert all(isinstance(v, (int, float, str, bool, type(None))) for v in data.values())
    assert ModelConfig(**data) == cfg


@pytest.mark.parametrize(
    "fields, field, hint",
    [
        (
            {"hidden_size": 250, "n_heads": 8},
            "model.hidden_size=250",
            "pick n_heads from [1, 2, 5, 10, 25, 50, 125, 250]",
        ),
        ({"n_heads": 8, "n_kv_heads": 3}, "model.n_kv_heads=3", "pick one of [1, 2, 4, 8]"),
        ({"n_heads": 8, "n_kv_heads": 0}, "model.n_kv_heads=0", "must divide"),
        ({"hidden_size": 24, "n_heads": 8}, "head_dim", "change model.hidden_size or model.n_heads"),
        ({"multiple_of": 0}, "model.multiple_of=0", "must be > 0"),
        ({"norm": "batchnorm"}, "model.norm='batchnorm'", "['rmsnorm', 'rmsnorm_bf16', 'layernorm', 'none']"),
        ({"mlp": "moe"}, "model.mlp='moe'", "['swiglu', 'geglu', 'gelu', 'relu2']"),
        ({"vocab_size": 0}, "model.vocab_size=0", "positive"),
        ({"vocab_multiple": 0}, "model.vocab_multiple=0", "positive"),
        ({"hidden_size": -8}, "model.hidden_size=-8", "positive"),
        ({"n_layers": 0}, "model.n_layers=0", "positive"),
        ({"n_heads": 0}, "model.n_heads=0", "positive"),
        ({"max_seq_len": 0}, "model.max_seq_len=0", "positive"),
        ({"intermediate_size": 0}, "model.intermediate_size=0", "> 0 or null"),
        ({"ffn_dim_multiplier": 0.0}, "model.ffn_dim_multiplier=0.0", "> 0 or null"),
        ({"dropout": 1.0}, "model.dropout=1.0", "[0, 1)"),
        ({"norm_eps": 0.0}, "model.norm_eps=0.0", "> 0"),
        ({"rope_theta": -1.0}, "model.rope_theta=-1.0", "> 0"),
        ({"init_std": 0.0}, "model.init_std=0.0", "> 0"),
    ],
)
def test_invalid_values_name_the_field_and_the_fix(fields, field, hint):
    with pytest.raises(ValueError) as err:
        ModelConfig(**fields)
    message = str(err.value)
    assert field in message and hint in message, message
    assert "\n" not in message


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"norm_eps": 0.0}, "model.norm_eps=0.0 must be > 0 (e.g. 1e-5)"),
        ({"rope_theta": -1.0}, "model.rope_theta=-1.0 must be > 0 (e.g. 10000.0)"),
        ({"init_std": 0.0}, "model.init_std=0.0 must be > 0 (e.g. 0.02)"),
        (
            {"hidden_size": 24, "n_heads": 8},
            "head_dim = hidden_size/n_heads = 3 is odd, but RoPE rotates pairs of "
            "dimensions; change model.hidden_size or model.n_heads so it is even",
        ),
    ],
)
def test_whole_messages(fields, message):
    with pytest.raises(ValueError) as err:
        ModelConfig(**fields)
    assert str(err.value) == message


def test_the_smallest_valid_values_are_accepted():
    """The limits are "> 0", not "> 1": a multiple of 1, a multiplier below 1, a one-unit MLP, a tiny eps."""
    cfg = ModelConfig(multiple_of=1, ffn_dim_multiplier=0.5, norm_eps=1e-12, rope_theta=0.5, init_std=1e-4)
    assert cfg.resolved_intermediate_size == int(0.5 * int(8 * cfg.hidden_size / 3))
    assert ModelConfig(intermediate_size=1).resolved_intermediate_size == 1


# ---- μP, the config's half (docs/mup.md) -------------------------------------------------------------------------


def mup_config(**overrides) -> ModelConfig:
    """hidden 32 over base 16: m = 2, head_dim 8 over a base head_dim of 4."""
    return tiny_model_config(**{"parametrization": "mup", "mup_base_width": 16, **overrides})


def test_sp_is_the_default_and_model_configs_without_the_fields_load_as_sp():
    assert PARAMETRIZATIONS == ("sp", "mup")
    assert (ModelConfig().parametrization, ModelConfig().mup_base_width) == ("sp", 256)
    saved = dataclasses.asdict(tiny_model_config())
    del saved["parametrization"], saved["mup_base_width"]  # a model_config.json written before μP
    assert ModelConfig(**saved) == tiny_model_config()
    cfg = mup_config()
    assert ModelConfig(**json.loads(json.dumps(dataclasses.asdict(cfg)))) == cfg  # checkpoints carry them


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(parametrization="muP"), "model.parametrization='muP' is unknown; choose one of ['sp', 'mup']"),
        (dict(mup_base_width=0), "model.mup_base_width=0 must be a positive integer"),
        (dict(mup_base_width=-64), "model.mup_base_width=-64 must be a positive integer"),
        (dict(mup_attention_scale="1/d"), "model.mup_attention_scale='1/d' is unknown; choose mup (sqrt(d0)/d) or sp"),
    ],
)
def test_bad_parametrization_values_are_one_line_errors_naming_the_field(overrides, message):
    with pytest.raises(ValueError) as raised:
        tiny_model_config(**overrides)
    assert str(raised.value).startswith(message) and "\n" not in str(raised.value)


def test_mups_multipliers_and_sps_ones():
    """m = hidden / base; the blocks' init × 1/sqrt(m); the head's input × 1/m; q·k × sqrt(base head_dim)/head_dim
    (SDPA's 1/sqrt(head_dim) at the base width). Under sp (and the sp attention arm) nothing is multiplied."""
    mup = mup_config()  # m = 2, head_dim 8
    assert (mup.width_multiplier, mup.hidden_init_scale, mup.output_multiplier) == (2.0, 1 / math.sqrt(2), 0.5)
    assert mup.attention_scale == pytest.approx(math.sqrt(4) / 8)
    at_base = mup_config(mup_base_width=32)
    assert at_base.width_multiplier == 1.0 and at_base.attention_scale == pytest.approx(1 / math.sqrt(8))
    sp = tiny_model_config(mup_base_width=16)
    assert (sp.width_multiplier, sp.hidden_init_scale) == (1.0, 1.0)
    assert sp.output_multiplier is None and sp.attention_scale is None
    assert mup_config(mup_attention_scale="sp").attention_scale is None
    assert dataclasses.replace(mup, hidden_size=64).width_multiplier == 4.0  # properties: a replace() re-derives


def test_describe_parametrization():
    assert tiny_model_config().describe_parametrization() == "sp"
    assert (
        ModelConfig(hidden_size=256, mup_base_width=64, parametrization="mup").describe_parametrization()
        == "mup (m = 4 over base width 64)"
    )
