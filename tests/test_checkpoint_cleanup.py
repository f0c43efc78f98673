"""Leftovers of a killed save are swept at start; resuming an older step moves the later ones aside."""

import os

import pytest

import training.checkpoint
from model import ModelConfig, Transformer
from training.checkpoint import (
    clean_partial_checkpoints,
    list_checkpoints,
    move_aside_later_checkpoints,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
    tokenizer_files,
)

CFG = dict(vocab_size=300, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


@pytest.fixture
def saver(tmp_path):
    """save(root, step, **state) with a tiny model; the tokenizer content does not matter here."""
    model = Transformer(ModelConfig(**CFG))
    tokenizer = tmp_path / "tokenizer.json"
    tokenizer.write_text("{}")

    def save(root, step, **state):
        return save_checkpoint(
            root,
            step,
            model.state_dict(),
            model.cfg,
            tokenizer_files(tokenizer),
            {"step": step, **state},
            optimizer_state={"state": {}, "param_groups": []},
            keep_last=0,
        )

    return save


def test_stray_tmp_dirs_are_removed_everywhere(tmp_path, saver):
    root = tmp_path / "checkpoints"
    kept = saver(root, 1)
    saver(root / "best", 1)
    strays = [root / "step_0000002.tmp", root / "best" / "step_0000002.tmp"]
    for stray in strays:
        stray.mkdir(parents=True)
        (stray / "model.safetensors").write_bytes(b"half")
    assert sorted(clean_partial_checkpoints(root)) == sorted(strays)
    assert not any(p.exists() for p in strays)
    assert list_checkpoints(root) == [kept] and list_checkpoints(root / "best") == [root / "best" / "step_0000001"]
    assert clean_partial_checkpoints(root) == [] and clean_partial_checkpoints(tmp_path / "none") == []


def test_a_resave_killed_between_its_renames_is_recovered(tmp_path, saver, monkeypatch):
    root = tmp_path / "checkpoints"
    saver(root, 2, version="first")
    renames = []
    real_replace = os.replace

    def killed_on_second_rename(src, dst):
        renames.append((src, dst))
        if len(renames) == 2:  # final -> .old done, .tmp -> final not yet: as if SIGKILLed here
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(training.checkpoint.os, "replace", killed_on_second_rename)
    with pytest.raises(KeyboardInterrupt):
        saver(root, 2, version="second")
    monkeypatch.undo()
    assert list_checkpoints(root) == []  # step_0000002.old and step_0000002.tmp, both complete
    assert sorted(p.name for p in root.iterdir()) == ["step_0000002.old", "step_0000002.tmp"]
    assert clean_partial_checkpoints(root) == [root / "step_0000002.tmp"]
    (restored,) = list_checkpoints(root)
    assert read_state(restored)["version"] == "first"


def test_later_checkpoints_move_aside_when_resuming_an_older_one(tmp_path, saver):
    run = tmp_path / "run"
    root = run / "checkpoints"
    steps = [saver(root, step) for step in (1, 2, 3, 4)]
    saver(root / "best", 3)  # the best checkpoint of the abandoned branch
    moved = move_aside_later_checkpoints(root, 2)
    (aside,) = [p for p in root.iterdir() if p.name.startswith("abandoned-")]
    assert sorted(moved) == sorted([aside / "step_0000003", aside / "step_0000004", aside / "best" / "step_0000003"])
    assert list_checkpoints(root) == steps[:2] and list_checkpoints(root / "best") == []
    assert all((p / "state.json").exists() for p in moved)  # moved whole, nothing deleted
    assert "resumed from step_0000002" in (aside / "README.txt").read_text()
    # What `resume=<run dir>`, `latest` and keep_last see now is the branch being continued.
    assert resolve_checkpoint(str(run)) == steps[1]
    assert resolve_checkpoint("latest", str(tmp_path)) == steps[1]
    assert move_aside_later_checkpoints(root, 2) == []
    saver(root, 3)
    second = move_aside_later_checkpoints(root, 1)  # another branch, a second folder
    assert {p.parent for p in second} != {aside} and len(second) == 2
    assert len([p for p in root.iterdir() if p.name.startswith("abandoned-")]) == 2


def test_a_damaged_previous_save_never_hides_behind_a_tmp_name(tmp_path, saver):
    """A directory counts as a checkpoint only under its exact step_N name, and with state.json."""
    root = tmp_path / "checkpoints"
    saver(root, 5)
    for name in ("step_0000006.tmp", "step_0000007.old", "step_0000008x", "best"):
        (root / name).mkdir()
        (root / name / "state.json").write_text("{}")
    assert [p.name for p in list_checkpoints(root)] == ["step_0000005"]
