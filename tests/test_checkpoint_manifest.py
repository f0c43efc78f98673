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
    M.verify(ckpt)
    assert M.damage(ckpt) is None


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


def test_a_deleted_manifest_is_refused(ckpt):
    (ckpt / M.MANIFEST).unlink()
    assert refusal(ckpt) == (
        f"checkpoint {ckpt} has no manifest.json: it was deleted (nothing vouches for the other files), or the "
        f"checkpoint predates manifests (format 1: `git checkout {M.LAST_READER[1]}` reads it); use another checkpoint"
    )


def test_a_manifest_that_is_not_a_minillama_one_is_damage(ckpt):
    fields = json.loads((ckpt / M.MANIFEST).read_text())
    (ckpt / M.MANIFEST).write_text(json.dumps({**fields, "format": "other/1"}))
    assert refusal(ckpt) == (
        f"{ckpt / M.MANIFEST} is unreadable (not a minillama manifest); the checkpoint is damaged: use another one"
    )


def test_a_later_version_is_refused_naming_the_checkpoint_and_the_version_read(ckpt):
    fields = json.loads((ckpt / M.MANIFEST).read_text())
    (ckpt / M.MANIFEST).write_text(json.dumps({**fields, "format": f"{M.FORMAT_PREFIX}{M.FORMAT_VERSION + 1}"}))
    assert refusal(ckpt) == (
        f"checkpoint {ckpt} is in checkpoint format {M.FORMAT_VERSION + 1}, written by a newer minillama; this one "
        f"reads format {M.FORMAT_VERSION}: update minillama (git pull, then make setup) to load it"
    )


def test_a_written_manifest_is_two_space_indented_json_a_field_a_line(ckpt):
    """As state.json is: `cat manifest.json` shows each file's size and hash on lines of their own."""
    (ckpt / M.MANIFEST).unlink()
    M.write_manifest(ckpt)
    text = (ckpt / M.MANIFEST).read_text()
    assert text == json.dumps(json.loads(text), indent=2) + "\n"
    assert json.loads(text)["format"] == f"{M.FORMAT_PREFIX}{M.FORMAT_VERSION}" and M.damage(ckpt) is None


LISTED = sorted(json.loads((checkpoint_of(fixture_dir(M.FORMAT_VERSION)) / M.MANIFEST).read_text())["files"])


@pytest.mark.parametrize("name", LISTED)
def test_every_listed_file_is_checked_a_changed_byte_and_a_deletion_alike(ckpt, name):
    """Each file the manifest lists, not only the weights (issue 68: the byte-flip tests only flipped
    model.safetensors, so a check that skipped one file passed them): one byte changed, same size, is refused naming
    that file; so is the file deleted."""
    assert len(LISTED) >= 7  # weights, model config, tokenizer, config, optimizer, RNG, state
    path = ckpt / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    assert f"is damaged: {name} does not match its SHA-256 in the manifest" in refusal(ckpt)
    path.unlink()
    assert f"is damaged: {name} is missing;" in refusal(ckpt)
