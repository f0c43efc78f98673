"""Checkpoint directories: atomic writes, pruning, `latest`, strict and safe loading."""
import json

import pytest
import torch

from model import ModelConfig, Transformer
from training.checkpoint import (CheckpointError, list_checkpoints, load_model, load_training_state,
                                 resolve_checkpoint, save_checkpoint)

CFG = dict(vocab_size=300, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


@pytest.fixture
def tokenizer_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(["hello world"] * 10, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path, tok.get_vocab_size()


def save(root, step, model, tokenizer_path, **kw):
    opt = torch.optim.AdamW(model.parameters())
    return save_checkpoint(root, step, model.state_dict(), model.cfg, tokenizer_path, {"step": step, "tokens_seen": 0,
                           "elapsed_s": 0.0}, "a: 1\n", opt.state_dict(), **kw)


def test_roundtrip_is_exact_and_head_stays_tied(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    ckpt = save(tmp_path / "ckpts", 5, model, path)
    loaded, tok, where = load_model(str(ckpt))
    assert where == ckpt and tok.get_vocab_size() == vocab
    for (n, p), q in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(p, q), n
    assert loaded.lm_head.weight.data_ptr() == loaded.embed_tokens.weight.data_ptr()
    state, opt, rng = load_training_state(ckpt)
    assert state["step"] == 5 and "torch" in rng and opt is not None


def test_prune_keeps_last_k_and_ignores_half_written(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    for step in (1, 2, 3, 4):
        save(tmp_path, step, model, path, keep_last=2)
    (tmp_path / "step_0000009.tmp").mkdir()  # a crash mid-save
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003", "step_0000004"]
    assert resolve_checkpoint(str(tmp_path)).name == "step_0000004"


def test_latest_finds_the_newest_checkpoint(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    save(tmp_path / "outputs" / "a" / "checkpoints", 7, model, path)
    newest = save(tmp_path / "outputs" / "b" / "checkpoints", 3, model, path)
    assert resolve_checkpoint("latest", str(tmp_path / "outputs")) == newest
    assert resolve_checkpoint(str(tmp_path / "outputs" / "b")) == newest  # a run dir
    with pytest.raises(CheckpointError, match="found no checkpoint"):
        resolve_checkpoint("latest", str(tmp_path / "nothing"))


def test_bad_checkpoints_raise_clear_errors(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    ckpt = save(tmp_path / "ck", 1, model, path)
    with pytest.raises(CheckpointError, match="not a minillama checkpoint"):
        resolve_checkpoint(str(path.parent))  # a directory, but no checkpoint
    cfg = json.loads((ckpt / "model_config.json").read_text())
    (ckpt / "model_config.json").write_text(json.dumps({**cfg, "vocab_size": vocab + 1}))
    with pytest.raises(CheckpointError, match="tokenizer has"):
        load_model(str(ckpt))
    (ckpt / "model_config.json").write_text(json.dumps({**cfg, "hidden_size": 64}))
    with pytest.raises(CheckpointError, match="shape"):
        load_model(str(ckpt))
    (ckpt / "model_config.json").write_text(json.dumps(cfg))
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(str(ckpt))
