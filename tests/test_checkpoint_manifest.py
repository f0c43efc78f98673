"""The manifest's refusals (training/checkpoint.py), each as the whole line a user reads (docs/reliability.md
rows 52–55, 85, 86), on a copy of the intact checkpoint kept in tests/fixtures/: no training, so they run beside
the rest. test_checkpoint_trust.py checks the same refusals through every loader."""

import json
import shutil

import pytest

import training.checkpoint as M
from tests.checkpoint_fixture import checkpoint_of, fixture_dir
from training.checkpoint import CheckpointError


@pytest.fixture
def ckpt(tmp_path):
    return shutil.copytree(checkpoint_of(fixture_dir(M.FORMAT_VERSION)), tmp_path / "step_0000002")


def refusal(ckpt) -> str:
    with pytest.raises(CheckpointError) as refused:
        M.verify(ckpt)
    return str(refused.value)


def test_an_intact_checkpoint_verifies_silently(ckpt):
    warned = []
    M.verify(ckpt, warn=warned.append)
    assert warned == [] and M.damage(ckpt) is None


@pytest.mark.parametrize("extra, said", [(["a.bin"], ""), (["a.bin", "b.bin"], "; 1 more unlisted")])
def test_unlisted_files_are_named_and_counted(ckpt, extra, said):
    for name in extra:
        (ckpt / name).write_bytes(b"x")
    (ckpt / "notes.md").write_text("a note")  # documentation is never read: not counted
    assert refusal(ckpt) == (
        f"checkpoint {ckpt} is damaged: a.bin is not in the manifest (added after the checkpoint "
        f"was written{said}), and a loader would read it; use another checkpoint (an earlier "
        "step, or checkpoints/best), or --no-verify / verify_checkpoint=false to load it anyway"
    )


def test_a_deleted_manifest_is_refused_where_state_json_shows_one_was_written(ckpt):
    (ckpt / M.MANIFEST).unlink()
    assert refusal(ckpt) == (
        f"checkpoint {ckpt} has no manifest.json, but its state.json was written by a minillama "
        "that writes one: it was deleted, so nothing vouches for the other files; restore it, use "
        "another checkpoint, or --no-verify / verify_checkpoint=false to load it unchecked"
    )


def test_a_manifest_that_is_not_a_minillama_one_is_damage(ckpt):
    fields = json.loads((ckpt / M.MANIFEST).read_text())
    (ckpt / M.MANIFEST).write_text(json.dumps({**fields, "format": "other/1"}))
    assert refusal(ckpt) == (
        f"{ckpt / M.MANIFEST} is unreadable (not a minillama manifest); the checkpoint is damaged: "
        "use another one, or --no-verify / verify_checkpoint=false to load it unchecked"
    )


def test_a_later_version_is_refused_naming_the_checkpoint_and_the_versions_read(ckpt, monkeypatch):
    fields = json.loads((ckpt / M.MANIFEST).read_text())
    (ckpt / M.MANIFEST).write_text(json.dumps({**fields, "format": f"{M.FORMAT_PREFIX}3"}))
    monkeypatch.setattr(M, "FORMAT_VERSION", 2)  # a minillama that reads two formats
    assert refusal(ckpt) == (
        f"checkpoint {ckpt} is in checkpoint format 3, written by a newer minillama; this one "
        "reads formats 1 to 2: update minillama (git pull, then make setup) to load it"
    )


def test_a_written_manifest_is_two_space_indented_json_a_field_a_line(ckpt):
    """As state.json is: `cat manifest.json` shows each file's size and hash on lines of their own."""
    (ckpt / M.MANIFEST).unlink()
    M.write_manifest(ckpt)
    text = (ckpt / M.MANIFEST).read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    assert json.loads(text)["format"] == f"{M.FORMAT_PREFIX}{M.FORMAT_VERSION}" and M.damage(ckpt) is None
