"""ModelConfig: resolved derived fields, a lossless round trip through JSON, and errors that name the field."""
import dataclasses
import json

import pytest

from model import ModelConfig, swiglu_intermediate_size


def test_derived_fields_are_resolved_numbers():
    cfg = ModelConfig(hidden_size=256, n_heads=8, multiple_of=32)
    assert cfg.n_kv_heads == 8 and cfg.intermediate_size == 704 and cfg.head_dim == 32
    assert ModelConfig(hidden_size=4096, n_heads=32, multiple_of=256).intermediate_size == 11008
    assert ModelConfig(hidden_size=256, ffn_dim_multiplier=1.5).intermediate_size == \
        swiglu_intermediate_size(256, 32, 1.5) == 1024
    assert ModelConfig(n_kv_heads=2).n_kv_heads == 2


def test_two_matrix_mlps_default_to_4d_and_explicit_size_wins():
    assert ModelConfig(hidden_size=256, mlp="gelu").intermediate_size == 1024
    assert ModelConfig(hidden_size=256, mlp="relu2").intermediate_size == 1024
    assert ModelConfig(hidden_size=256, mlp="geglu").intermediate_size == 704
    assert ModelConfig(hidden_size=256, intermediate_size=500).intermediate_size == 500


@pytest.mark.parametrize("fields", [
    {}, {"n_kv_heads": 2, "ffn_dim_multiplier": 1.3, "tie_embeddings": False},
    {"norm": "layernorm", "mlp": "gelu", "intermediate_size": 300, "rope_theta": 5e5, "dropout": 0.1},
])
def test_round_trip_through_json(fields):
    cfg = ModelConfig(**fields)
    data = json.loads(json.dumps(dataclasses.asdict(cfg)))
    assert all(isinstance(v, (int, float, str, bool, type(None))) for v in data.values())
    assert ModelConfig(**data) == cfg


@pytest.mark.parametrize("fields, field, hint", [
    ({"hidden_size": 250, "n_heads": 8}, "model.hidden_size=250", "pick n_heads from [1, 2, 5, 10, 25, 50, 125, 250]"),
    ({"n_heads": 8, "n_kv_heads": 3}, "model.n_kv_heads=3", "pick one of [1, 2, 4, 8]"),
    ({"n_heads": 8, "n_kv_heads": 0}, "model.n_kv_heads=0", "must divide"),
    ({"hidden_size": 24, "n_heads": 8}, "head_dim", "change model.hidden_size or model.n_heads"),
    ({"multiple_of": 0}, "model.multiple_of=0", "must be > 0"),
    ({"norm": "batchnorm"}, "model.norm='batchnorm'", "['layernorm', 'rmsnorm']"),
    ({"mlp": "moe"}, "model.mlp='moe'", "['geglu', 'gelu', 'relu2', 'swiglu']"),
    ({"vocab_size": 0}, "model.vocab_size=0", "positive"),
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
])
def test_invalid_values_name_the_field_and_the_fix(fields, field, hint):
    with pytest.raises(ValueError) as err:
        ModelConfig(**fields)
    message = str(err.value)
    assert field in message and hint in message, message
    assert "\n" not in message
