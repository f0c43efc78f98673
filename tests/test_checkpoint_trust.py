"""Checkpoints trusted on load: every loader — resume (train.py), generate, evaluate, export and import —
refuses a flipped byte, NaN weights and a missing file in one `error:` line naming the file, from the
manifest.json the writer made. With verification off (--no-verify, verify_checkpoint=false) the loaders
still refuse NaN weights and missing files by their own checks; a flipped byte inside a tensor only the
manifest can see."""

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from scripts import evaluate, export_hf, generate, import_hf
from tests.train_helpers import run_dirs, run_train, train_in_process
from training.checkpoint import tokenizer_files
from training.program import exit_status

pytestmark = pytest.mark.serial  # trains (the run every case starts from, and the resumes)

RUN_ARGS = ["trainer.max_steps=4", "trainer.eval_interval=4", "trainer.ckpt_interval=4"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_data_cache):
    """A finished tiny run (4 steps), its checkpoint step_0000004 intact; each test damages a copy."""
    root = tmp_path_factory.mktemp("trusted") / "run"
    train_in_process(root, *RUN_ARGS, cache_dir=tiny_data_cache)
    return root


def copy_run(run, tmp_path):
    copy = tmp_path / "outputs" / "2026-01-01" / "00-00-00_debug"
    shutil.copytree(run, copy)
    return copy, copy / "checkpoints" / "step_0000004"


def flip_bytes(ckpt, name="model.safetensors"):
    """64 bytes XOR-ed inside the tensor data (the header stays valid: it loads, wrong)."""
    path = ckpt / name
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(b ^ 0xFF for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


def write_nan(ckpt, name="model.safetensors", key="norm.weight"):
    weights = load_file(ckpt / name)
    weights[key][0] = float("nan")
    save_file(weights, str(ckpt / name), metadata={"format": "pt"})


def add_unlisted(ckpt):
    """A special_tokens.json the writer never listed, ending text at the first "e": before issue 38 it changed
    generation, evaluation and the export (whose fresh manifest vouched for it), all exit 0."""
    (ckpt / "special_tokens.json").write_text(json.dumps({"bos": None, "eos": "e", "pad": None}))


def delete_manifest(ckpt):
    """manifest.json deleted and 64 bytes of the weights flipped: before issue 38, a warning that blamed "an older
    minillama", then resume, evaluate and export ran on the corrupted weights."""
    (ckpt / "manifest.json").unlink()
    flip_bytes(ckpt)


NO_MANIFEST = "has no manifest.json: it was deleted (nothing vouches for the other files)"
DAMAGE = {
    "flipped_byte": (flip_bytes, "is damaged: model.safetensors does not match its SHA-256 in the manifest"),
    "unlisted": (add_unlisted, "is damaged: special_tokens.json is not in the manifest (added after"),
    "no_manifest": (delete_manifest, NO_MANIFEST),
    "nan": (write_nan, "is damaged: model.safetensors does not match its SHA-256 in the manifest"),
    "missing": (lambda ckpt: (ckpt / "tokenizer.json").unlink(), "is damaged: tokenizer.json is missing"),
}
UNVERIFIED = {  # what the loaders' own checks say once the manifest is not consulted
    "nan": "holds NaN or inf in norm.weight",
    "missing": "tokenizer.json",
}


def program_error(capsys, main, args) -> str:
    """The one line a program prints for a user's error (and its exit status must be 1)."""
    code = exit_status(main, [str(a) for a in args])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 1 and err and err[-1].startswith("error: "), (code, err)
    return err[-1]


LOADERS = {
    "generate": lambda ckpt, tmp, extra: (
        generate.main,
        [ckpt, "--prompt", "a", "--max-new-tokens", "2", "--device", "cpu", *extra],
    ),
    "evaluate": lambda ckpt, tmp, extra: (evaluate.main, [ckpt, "--text", _text(tmp), "--device", "cpu", *extra]),
    "export": lambda ckpt, tmp, extra: (export_hf.main, [ckpt, tmp / "hf", *extra]),
}


def _text(tmp):
    path = tmp / "score.txt"
    path.write_text("ROMEO: But, soft! what light through yonder window breaks?\n")
    return path


@pytest.mark.parametrize("loader", sorted(LOADERS))
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_generate_evaluate_and_export_refuse_a_damaged_checkpoint(run, tmp_path, capsys, loader, damage):
    _, ckpt = copy_run(run, tmp_path)
    harm, message = DAMAGE[damage]
    harm(ckpt)
    main, args = LOADERS[loader](ckpt, tmp_path, [])
    line = program_error(capsys, main, args)
    assert line == f"error: checkpoint {ckpt} {message}" + line.split(message, 1)[1], line
    assert "use another checkpoint" in line and ("--no-verify" in line) == (damage != "no_manifest")
    if damage in UNVERIFIED:  # without the manifest, the loader's own checks still refuse it
        main, args = LOADERS[loader](ckpt, tmp_path, ["--no-verify"])
        assert UNVERIFIED[damage] in program_error(capsys, main, args)
    assert not (tmp_path / "hf").exists()  # a refused export leaves nothing


@pytest.mark.parametrize("damage", sorted(set(DAMAGE) - {"no_manifest"}))  # a foreign HF dir has none: below
def test_import_refuses_a_damaged_export(run, tmp_path, capsys, damage):
    assert exit_status(export_hf.main, [str(run / "checkpoints" / "step_0000004"), str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    hf = tmp_path / "hf"
    assert (hf / "manifest.json").is_file()
    harm, message = DAMAGE[damage]
    harm(hf, key="model.norm.weight") if damage == "nan" else harm(hf)
    line = program_error(capsys, import_hf.main, [hf, tmp_path / "imported"])
    assert line.startswith(f"error: checkpoint {hf} {message}"), line
    assert not (tmp_path / "imported" / "checkpoints").exists()
    if damage == "nan":  # unverified, the import's own check refuses NaN weights
        line = program_error(capsys, import_hf.main, [hf, tmp_path / "imported", "--no-verify"])
        assert "the weights hold NaN or inf (norm.weight" in line


def test_an_intact_export_imports_and_a_foreign_one_is_said_unverifiable(run, tmp_path, capsys):
    assert exit_status(export_hf.main, [str(run / "checkpoints" / "step_0000004"), str(tmp_path / "hf")]) == 0
    assert exit_status(import_hf.main, [str(tmp_path / "hf"), str(tmp_path / "a")]) == 0
    (tmp_path / "hf" / "manifest.json").unlink()  # as a Hugging Face download has none
    capsys.readouterr()
    assert exit_status(import_hf.main, [str(tmp_path / "hf"), str(tmp_path / "b")]) == 0
    assert "has no manifest.json (Hugging Face directories carry no checksums): unverified" in capsys.readouterr().err


RESUME = {  # damage → the line train.py ends with, verified and (when the run's own checks see it) unverified
    "flipped_byte": (flip_bytes, "is damaged: model.safetensors does not match its SHA-256", None),
    "nan": (write_nan, "is damaged: model.safetensors does not match its SHA-256", "holds NaN or inf in norm.weight"),
    "missing": (
        lambda ckpt: (ckpt / "optimizer.pt").unlink(),
        "is damaged: optimizer.pt is missing",
        "optimizer.pt is missing; the checkpoint is incomplete",
    ),
    "unlisted": (add_unlisted, "is damaged: special_tokens.json is not in the manifest", None),
    "no_manifest": (delete_manifest, NO_MANIFEST, None),
}


@pytest.mark.parametrize("damage", sorted(RESUME))
def test_resume_refuses_a_damaged_checkpoint_and_trains_nothing(run, tmp_path, tiny_data_cache, damage):
    copy, ckpt = copy_run(run, tmp_path)
    harm, verified, unverified = RESUME[damage]
    harm(ckpt)
    for extra, message in (([], verified), (["verify_checkpoint=false"], unverified)):
        if message is None:
            continue
        proc = run_train(
            tmp_path, f"resume={copy}", "trainer.max_steps=8", *extra, cache_dir=tiny_data_cache, check=False
        )
        assert proc.returncode == 1 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-1500:]
        assert sorted(p.name for p in (copy / "checkpoints").glob("step_*")) == ["step_0000004"]
    assert run_dirs(tmp_path) == [copy]  # no new run directory either


def test_keep_last_prunes_only_what_is_older_than_the_checkpoint_it_wrote(tmp_path, tiny_data_cache):
    """keep_last=1 keeps the checkpoint just written and prunes the older ones — never a later one (here a newer one
    with bit rot stays, and the last checkpoint that verifies is the one just written)."""
    from training.checkpoint import (
        last_good_checkpoint,
        load_model_config,
        read_state,
        safe_torch_load,
        save_checkpoint,
    )

    train_in_process(
        tmp_path / "run",
        "trainer.max_steps=6",
        "trainer.ckpt_interval=2",
        "trainer.keep_last=0",
        "trainer.eval_interval=6",
        cache_dir=tiny_data_cache,
    )
    ckpts = tmp_path / "run" / "checkpoints"
    flip_bytes(ckpts / "step_0000006")  # bit rot in the newest
    step_4 = ckpts / "step_0000004"  # re-saved as it is (a save prunes), with keep_last=1
    save_checkpoint(
        ckpts,
        4,
        load_file(step_4 / "model.safetensors"),
        load_model_config(step_4),
        tokenizer_files(step_4 / "tokenizer.json"),
        read_state(step_4),
        (step_4 / "config.yaml").read_text(),
        safe_torch_load(step_4 / "optimizer.pt"),
        keep_last=1,
        rng_state=safe_torch_load(step_4 / "rng.pt"),
    )
    assert sorted(p.name for p in ckpts.glob("step_*")) == ["step_0000004", "step_0000006"]
    assert last_good_checkpoint(ckpts) == ckpts / "step_0000004"


def test_an_export_vouches_only_for_weights_it_verified(run, tmp_path, capsys):
    """A verified export gets a manifest; one made with --no-verify gets none and says why — so import_hf then calls it
    unverifiable instead of trusting a fresh manifest."""
    ckpt = run / "checkpoints" / "step_0000004"
    assert exit_status(export_hf.main, [str(ckpt), str(tmp_path / "checked")]) == 0
    assert (tmp_path / "checked" / "manifest.json").is_file()
    capsys.readouterr()
    assert exit_status(export_hf.main, [str(ckpt), str(tmp_path / "unchecked"), "--no-verify"]) == 0
    assert not (tmp_path / "unchecked" / "manifest.json").exists()
    assert "gets no manifest.json" in capsys.readouterr().err and (tmp_path / "unchecked" / "config.json").is_file()


def test_documentation_beside_the_files_is_not_refused(run, tmp_path, capsys):
    """No loader reads a note or a model card: *.md / *.txt and hidden files may sit beside the listed files."""
    _, ckpt = copy_run(run, tmp_path)
    (ckpt / "README.md").write_text("# my run\n")
    (ckpt / ".DS_Store").write_bytes(b"\0")
    assert exit_status(generate.main, [str(ckpt), "--prompt", "a", "--max-new-tokens", "2", "--device", "cpu"]) == 0


def test_a_run_whose_only_checkpoint_is_its_best_resumes_from_it(run, tmp_path, tiny_data_cache):
    """A run that died between its first evaluation and its first periodic checkpoint has only
    checkpoints/best/step_N: `resume=<run dir>` continues from it, and it is the run's last intact checkpoint."""
    from training.checkpoint import last_good_checkpoint, resolve_checkpoint

    copy, ckpt = copy_run(run, tmp_path)
    best = copy / "checkpoints" / "best" / "step_0000004"
    assert best.is_dir()
    shutil.rmtree(ckpt)
    assert resolve_checkpoint(str(copy)) == best and last_good_checkpoint(copy / "checkpoints") == best
    proc = run_train(tmp_path, f"resume={copy}", "trainer.max_steps=6", cache_dir=tiny_data_cache)
    assert f"resuming {best}" in proc.stdout
    assert (copy / "checkpoints" / "step_0000006" / "state.json").is_file()
