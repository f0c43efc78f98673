"""The ablation variants (norm=none, norm=rmsnorm_bf16, qk_norm) and the derived-field YAML keys, as a
user reaches them: composed by Hydra, trained a few steps, saved and loaded through a checkpoint."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from model_helpers import one_thread

from model import ModelConfig, Transformer
from tests.tiny_checkpoint import tiny_tokenizer
from training.checkpoint import load_model, save_checkpoint, tokenizer_files
from training.program import compose_train_config


def compose_model(overrides: list) -> ModelConfig:
    """configs/ + overrides → the typed ModelConfig, as train.py builds it (schema checked by Hydra)."""
    return compose_train_config(["model=tiny", "data.vocab_size=300", *overrides])[0].model


@pytest.mark.parametrize(
    "overrides, check",
    [
        (["model.norm=none"], lambda c: c.norm == "none"),
        (["model.norm=rmsnorm_bf16"], lambda c: c.norm == "rmsnorm_bf16"),
        (["model.qk_norm=true"], lambda c: c.qk_norm),
        (
            ["model.norm=layernorm", "model.qk_norm=true", "model.mlp=gelu"],
            lambda c: c.norm == "layernorm" and c.qk_norm,
        ),
    ],
)
def test_variant_composes_trains_and_round_trips_a_checkpoint(tmp_path, overrides, check):
    cfg = compose_model(overrides)
    assert check(cfg) and cfg.padded_vocab_size == 320
    torch.manual_seed(0)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batch = torch.randint(0, cfg.vocab_size, (4, 33), generator=torch.Generator().manual_seed(0))
    losses = []
    with one_thread():
        for _ in range(15):
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten())
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.3, losses  # it learns

    tokenizer_path = tmp_path / "tokenizer.json"
    tiny_tokenizer().save(str(tokenizer_path))
    ckpt = save_checkpoint(
        tmp_path / "checkpoints", 15, model.state_dict(), cfg, tokenizer_files(tokenizer_path), state={"step": 15}
    )
    loaded, _, _ = load_model(str(ckpt))
    assert loaded.cfg == cfg
    with torch.no_grad():
        assert torch.equal(loaded(batch[:, :-1]), model.eval()(batch[:, :-1]))


def test_yaml_keys_for_derived_sizes_still_work_and_unset_ones_stay_derived():
    explicit = compose_model(["model.intermediate_size=100", "model.n_kv_heads=1"])
    assert (explicit.resolved_intermediate_size, explicit.resolved_n_kv_heads) == (100, 1)
    derived = compose_model(["model.n_kv_heads=null"])
    assert derived.intermediate_size is None and derived.resolved_intermediate_size == 176  # 8/3·64 → 16s
    wider = dataclasses.replace(derived, hidden_size=128)
    assert (wider.resolved_intermediate_size, wider.resolved_n_kv_heads, wider.head_dim) == (352, 4, 32)
    assert dataclasses.replace(explicit, hidden_size=128).resolved_intermediate_size == 100
