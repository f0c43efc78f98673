"""A checkpoint whose files disagree, or a resume that would change its model or its data, stops with one line."""

import dataclasses
import json

import pytest
import yaml

from model import ModelConfig, Transformer
from tests.test_checkpoint import CFG, tokenizer_file  # noqa: F401 (a fixture: the same tiny BPE tokenizer)
from training.checkpoint import (
    CheckpointError,
    Resume,
    load_model,
    open_checkpoint,
    save_checkpoint,
    tokenizer_files,
)

DATA = {"cache": "local-0123", "tokens": 1000, "train_sha256": "t", "val_sha256": "v", "tokenizer_hash": "k"}


@pytest.fixture
def ckpt(tmp_path, tokenizer_file):  # noqa: F811 (the fixture imported above)
    """A checkpoint as train.py writes it: config.yaml holds the run's model section, state.json its data."""
    tokenizer_path, vocab = tokenizer_file
    cfg = ModelConfig(**{**CFG, "vocab_size": vocab})
    config_yaml = yaml.safe_dump({"model": dataclasses.asdict(cfg), "trainer": {"max_steps": 10}})
    return save_checkpoint(
        tmp_path / "checkpoints",
        7,
        Transformer(cfg).state_dict(),
        cfg,
        tokenizer_files(tokenizer_path),
        {"step": 7, "data": DATA},
        config_yaml,
    )


def edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def one_line_error(ckpt) -> str:
    with pytest.raises(CheckpointError) as error:
        load_model(str(ckpt), verify=False)  # verified, the manifest refuses an edited file first
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_consistent_checkpoint_passes(ckpt):
    _, cfg = open_checkpoint(str(ckpt))
    assert (cfg.hidden_size, cfg.n_layers) == (32, 2)


def test_hidden_size_edited_in_model_config_names_the_disagreeing_files(ckpt):
    edit_json(ckpt / "model_config.json", hidden_size=128)
    message = one_line_error(ckpt)
    assert message.startswith(
        f"checkpoint {ckpt} contradicts itself: model.safetensors does not hold what model_config.json "
        "(hidden_size=128, n_layers=2, vocab_size="
    )
    assert "embed_tokens.weight has shape (320, 32), not (320, 128)" in message
    assert message.endswith("restore them, or use another checkpoint")


def test_tokenizer_with_more_ids_than_the_model_has_rows(ckpt):
    edit_json(ckpt / "model_config.json", vocab_size=200)  # the padded embedding keeps its shape
    message = one_line_error(ckpt)
    vocab = len(json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"])
    assert f"tokenizer.json has token ids up to {vocab - 1} but model_config.json says vocab_size=200" in message


def test_resume_refuses_architecture_overrides_but_not_dropout(ckpt):
    _, cfg = open_checkpoint(str(ckpt))
    Resume.open(str(ckpt)).check_fits(dataclasses.replace(cfg, dropout=0.1, max_seq_len=64))
    with pytest.raises(
        CheckpointError,
        match=r"cannot resume .* with model.n_layers=3 "
        r"\(the checkpoint has n_layers=2\), "
        r"model.qk_norm=True \(the checkpoint has qk_norm=False\): a resumed run keeps the checkpoint's "
        r"architecture; drop those model.\* overrides$",
    ):
        Resume.open(str(ckpt)).check_fits(dataclasses.replace(cfg, n_layers=3, qk_norm=True))
    # An explicit intermediate_size equal to the derived one describes the same network.
    Resume.open(str(ckpt)).check_fits(dataclasses.replace(cfg, intermediate_size=cfg.resolved_intermediate_size))


def test_resume_refuses_other_data_naming_both_and_the_two_ways_on(ckpt):
    """The same digests are the same data, wherever the corpus lies now; other ones are refused, or recorded when
    asked (resume_changed_data=true)."""
    resume = Resume.open(str(ckpt))
    assert resume.check_data({**DATA, "cache": "local-moved"}, go_on=False) is None
    for changed, what in (({"train_sha256": "t2", "tokens": 1003}, "tokens"), ({"tokenizer_hash": "k2"}, "tokenizer")):
        now = {**DATA, "cache": "local-4567", **changed}
        with pytest.raises(CheckpointError) as refused:
            resume.check_data(now, go_on=False)
        assert str(refused.value) == (
            f"the data changed since {ckpt}: its run trained on 1,000 tokens (token cache local-0123), this corpus "
            f"gives {now['tokens']:,} with other {what} (cache local-4567); restore the data it trained on, or start "
            f"a new run from its weights: init_from={ckpt} (resume_changed_data=true goes on with this data, recorded "
            "in state.json)"
        )
        assert resume.check_data(now, go_on=True) == {"at_step": 7, "before": DATA, "after": now}
