"""A checkpoint whose files disagree, or a resume that would change its model, stops with one line."""

import dataclasses
import json

import pytest
import yaml

from model import ModelConfig, Transformer
from tests.test_checkpoint import CFG, tokenizer_file  # noqa: F401 (a fixture: the same tiny BPE tokenizer)
from training.checkpoint import CheckpointError, Resume, check_checkpoint_consistency, load_model, save_checkpoint


@pytest.fixture
def ckpt(tmp_path, tokenizer_file):  # noqa: F811 (the fixture imported above)
    """A checkpoint as train.py writes it: config.yaml holds the run's model section."""
    tokenizer_path, vocab = tokenizer_file
    cfg = ModelConfig(**{**CFG, "vocab_size": vocab})
    config_yaml = yaml.safe_dump({"model": dataclasses.asdict(cfg), "trainer": {"max_steps": 10}})
    return save_checkpoint(
        tmp_path / "checkpoints", 7, Transformer(cfg).state_dict(), cfg, tokenizer_path, {"step": 7}, config_yaml
    )


def edit_json(path, **changes):
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def edit_yaml_model(path, **changes):
    saved = yaml.safe_load(path.read_text())
    saved["model"].update(changes)
    path.write_text(yaml.safe_dump(saved))


def one_line_error(ckpt) -> str:
    with pytest.raises(CheckpointError) as error:
        check_checkpoint_consistency(ckpt)
    assert "\n" not in str(error.value)
    return str(error.value)


def test_a_consistent_checkpoint_passes(ckpt):
    cfg = check_checkpoint_consistency(ckpt)
    assert (cfg.hidden_size, cfg.n_layers) == (32, 2)


def test_hidden_size_edited_in_model_config_names_the_disagreeing_files(ckpt):
    edit_json(ckpt / "model_config.json", hidden_size=128)
    message = one_line_error(ckpt)
    assert message.startswith(f"checkpoint {ckpt} contradicts itself: model_config.json (hidden_size=128")
    assert (
        "does not match model.safetensors: embed_tokens.weight has shape (320, 32), the config needs (320, 128)"
    ) in message
    assert "config.yaml says model.hidden_size=32, model_config.json says 128" in message
    assert "intermediate_size" not in message  # derived from hidden_size: not a second disagreement
    assert message.endswith("restore them, or use another checkpoint")
    with pytest.raises(CheckpointError, match="contradicts itself"):  # generate.py's path checks the same
        load_model(str(ckpt), verify=False)  # (verified, the manifest refuses the edited file first)


def test_a_shape_free_change_is_caught_by_config_yaml(ckpt):
    edit_yaml_model(ckpt / "config.yaml", rope_theta=500000.0)  # no weight changes shape
    message = one_line_error(ckpt)
    assert "config.yaml says model.rope_theta=500000.0, model_config.json says 10000.0" in message
    assert "model.safetensors" not in message


def test_tokenizer_with_more_ids_than_the_model_has_rows(ckpt):
    edit_json(ckpt / "model_config.json", vocab_size=200)
    edit_yaml_model(ckpt / "config.yaml", vocab_size=200)  # the padded embedding keeps its shape
    message = one_line_error(ckpt)
    vocab = len(json.loads((ckpt / "tokenizer.json").read_text())["model"]["vocab"])
    assert f"tokenizer.json has token ids up to {vocab - 1} but model_config.json says vocab_size=200" in message


def test_a_checkpoint_without_a_training_config_is_checked_without_it(ckpt):
    (ckpt / "config.yaml").write_text("# imported from a Hugging Face model; no training config\n")
    check_checkpoint_consistency(ckpt)
    (ckpt / "config.yaml").write_text("model: [unclosed")
    assert "config.yaml is not valid YAML" in one_line_error(ckpt)


def test_resume_refuses_architecture_overrides_but_not_dropout(ckpt):
    cfg = check_checkpoint_consistency(ckpt)
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


def test_resume_refuses_a_data_tokenizer_other_than_the_checkpoints(ckpt, tmp_path):
    check_checkpoint_consistency(ckpt)
    same = tmp_path / "same.json"
    same.write_text(json.dumps(json.loads((ckpt / "tokenizer.json").read_text()), indent=4))  # reformatted
    Resume.open(str(ckpt)).check_tokenizer(same)
    other = tmp_path / "other.json"
    content = json.loads(same.read_text())
    content["model"]["merges"] = content["model"]["merges"][:-1]
    other.write_text(json.dumps(content))
    with pytest.raises(
        CheckpointError,
        match=rf"the data's tokenizer {other} differs from {ckpt}/tokenizer.json .*"
        rf"data.tokenizer_path={ckpt}/tokenizer.json$",
    ):
        Resume.open(str(ckpt)).check_tokenizer(other)
