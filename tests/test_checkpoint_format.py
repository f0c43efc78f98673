"""The checkpoint format: a checkpoint of the current version loads, computes what it did and resumes into the step its
run would have trained; what the writer writes now is that version's layout; a checkpoint of an older version (no
release ever wrote one) or a later one is refused in one line by every loader, verified or not — the older one naming
the last commit that reads it.

The fixtures are real run directories, made by tests/checkpoint_fixture.py (its docstring says when and how)."""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import training.checkpoint as checkpoint_format
from tests.checkpoint_fixture import STEP, checkpoint_of, fixed_tokens_loss, fixture_dir, recorded
from tests.test_run_files import CODE, REPO, literals
from tests.train_helpers import read_metrics, run_train
from training.checkpoint import (
    FORMAT_PREFIX,
    FORMAT_VERSION,
    LAST_READER,
    MANIFEST,
    CheckpointError,
    InitFrom,
    Resume,
    checkpoint_name,
    load_model,
    verify,
)

RECORDS = recorded()
VERSIONS = sorted(RECORDS)
# fp32 on any CPU class: the same numbers to ~1e-6 (tests/golden_curve.py); a misread checkpoint is off by far more.
TOLERANCE = 2e-5


def test_there_is_a_fixture_of_the_current_version_only():
    assert VERSIONS == [FORMAT_VERSION], (
        f"checkpoint formats with a fixture: {VERSIONS}; FORMAT_VERSION is {FORMAT_VERSION}: make the new format's "
        "fixture with `.venv/bin/python -m tests.checkpoint_fixture`, delete the older one, and name the last commit "
        "that reads the older one in LAST_READER"
    )
    assert set(LAST_READER) == set(range(1, FORMAT_VERSION))


@pytest.mark.parametrize("version", VERSIONS)
def test_a_checkpoint_of_every_format_loads_verified_and_computes_what_it_did(version):
    ckpt = checkpoint_of(fixture_dir(version))
    verify(ckpt)  # the fixture's bytes are what its manifest says (.gitattributes keeps git from touching them)
    assert fixed_tokens_loss(ckpt) == pytest.approx(RECORDS[version]["fixed_tokens_loss"], abs=TOLERANCE)


@pytest.fixture(scope="module")
def resumed(tiny_data_cache, tmp_path_factory):
    """{version: the run directory of `train.py resume=` on a copy of that version's fixture}."""
    runs = {}
    for version in VERSIONS:
        tmp = tmp_path_factory.mktemp(f"format_{version}")
        run = shutil.copytree(fixture_dir(version), tmp / "run")
        run_train(tmp, f"resume={run}", cache_dir=tiny_data_cache)
        runs[version] = run
    return runs


@pytest.mark.serial  # trains
@pytest.mark.parametrize("version", VERSIONS)
def test_a_checkpoint_of_every_format_resumes_into_the_step_its_run_would_have_trained(resumed, version):
    rows = [row for row in read_metrics(resumed[version]) if row["kind"] == "train"]
    assert [row["step"] for row in rows] == list(range(1, STEP + 2))  # the fixture's rows, then the resumed step
    assert rows[-1]["loss"] == pytest.approx(RECORDS[version]["next_step_loss"], abs=TOLERANCE)


@pytest.mark.serial  # reads the resumed run
def test_the_writer_writes_the_current_formats_layout(resumed):
    """Everything an older reader relies on, compared with the current version's fixture: a difference is a new
    format (see the message), not a fixture to re-make."""
    written = resumed[FORMAT_VERSION] / "checkpoints" / checkpoint_name(STEP + 1)
    fixture = checkpoint_of(fixture_dir(FORMAT_VERSION))
    expected, got = layout(fixture), layout(written)
    assert got == expected, (
        f"the checkpoint writer no longer writes format {FORMAT_VERSION}'s layout (files, fields, weight names, "
        "optimizer or RNG structure): an older minillama would misread it. Raise FORMAT_VERSION "
        "(training/checkpoint.py), keep reading the older formats, and make the new format's fixture — "
        "docs/architecture.md, 'Change the checkpoint format'"
    )


def test_the_layout_sees_a_renamed_field_a_new_weight_and_another_dtype(tmp_path):
    ckpt = shutil.copytree(checkpoint_of(fixture_dir(FORMAT_VERSION)), tmp_path / "ckpt")
    before = layout(ckpt)
    state = json.loads((ckpt / "state.json").read_text())
    state["tokens"] = state.pop("tokens_seen")  # a renamed field
    (ckpt / "state.json").write_text(json.dumps(state))
    assert layout(ckpt) != before
    shutil.copy(checkpoint_of(fixture_dir(FORMAT_VERSION)) / "state.json", ckpt / "state.json")
    assert layout(ckpt) == before
    optimizer = torch.load(ckpt / "optimizer.pt", weights_only=True)
    first = next(iter(optimizer["state"].values()))
    key = next(k for k, v in first.items() if torch.is_tensor(v) and v.is_floating_point())
    first[key] = first[key].to(torch.bfloat16)
    torch.save(optimizer, ckpt / "optimizer.pt")
    assert layout(ckpt) != before
    shutil.copy(checkpoint_of(fixture_dir(FORMAT_VERSION)) / "optimizer.pt", ckpt / "optimizer.pt")
    weights = load_file(ckpt / "model.safetensors")
    save_file({**weights, "extra.weight": torch.zeros(2)}, ckpt / "model.safetensors")
    assert layout(ckpt) != before


def _newer(tmp_path) -> Path:
    """A copy of the current fixture whose manifest says it is of the next format (its files unchanged)."""
    run = shutil.copytree(fixture_dir(FORMAT_VERSION), tmp_path / "newer")
    manifest = checkpoint_of(run) / MANIFEST
    fields = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**fields, "format": f"{FORMAT_PREFIX}{FORMAT_VERSION + 1}"}, indent=2))
    return run


@pytest.mark.parametrize("verified", [True, False])
def test_a_checkpoint_of_a_later_format_is_refused_by_every_loader(tmp_path, verified):
    run = _newer(tmp_path)
    ckpt = checkpoint_of(run)
    expected = (
        f"checkpoint {ckpt} is in checkpoint format {FORMAT_VERSION + 1}, written by a newer minillama; this "
        f"one reads format {FORMAT_VERSION}: update minillama (git pull, then make setup) to load it"
    )
    for load in (
        lambda: load_model(str(run), verify=verified),
        lambda: Resume.open(str(run), verify=verified),
        lambda: InitFrom.open(str(ckpt), verify=verified),
    ):
        with pytest.raises(CheckpointError) as refused:
            load()
        assert str(refused.value) == expected
    if verified:
        with pytest.raises(CheckpointError, match="written by a newer minillama"):
            verify(ckpt)  # the manifest check alone (import_hf's) refuses it too, not as damage


@pytest.mark.serial  # a train.py process
def test_a_resume_of_a_later_format_is_one_error_line_and_trains_nothing(tmp_path, tiny_data_cache):
    run = _newer(tmp_path)
    proc = run_train(tmp_path, f"resume={run}", cache_dir=tiny_data_cache, check=False)
    assert proc.returncode == 1
    assert (
        proc.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: checkpoint {checkpoint_of(run)} is in checkpoint format {FORMAT_VERSION + 1}")
    )
    assert not (run / "checkpoints" / checkpoint_name(STEP + 1)).exists()  # nothing trained, nothing written


def test_a_manifest_tag_that_is_not_a_version_is_damage(tmp_path):
    ckpt = shutil.copytree(checkpoint_of(fixture_dir(FORMAT_VERSION)), tmp_path / "ckpt")
    for tag in (f"{FORMAT_PREFIX}x", "other/1", 3):
        fields = json.loads((ckpt / MANIFEST).read_text())
        (ckpt / MANIFEST).write_text(json.dumps({**fields, "format": tag}))
        with pytest.raises(CheckpointError, match="is unreadable .*the checkpoint is damaged"):
            verify(ckpt)


@pytest.mark.parametrize("verified", [True, False])
def test_an_older_format_is_refused_by_every_loader_naming_the_last_commit_that_reads_it(tmp_path, verified):
    """Format 1 (state.json's fields as a hand-written mapping; before it, no manifest at all) was only ever written by
    this project's own runs: it is refused, never half-read, and the line says which commit reads it."""
    run = shutil.copytree(fixture_dir(FORMAT_VERSION), tmp_path / "older")
    ckpt = checkpoint_of(run)
    fields = json.loads((ckpt / MANIFEST).read_text())
    (ckpt / MANIFEST).write_text(json.dumps({**fields, "format": f"{FORMAT_PREFIX}1"}, indent=2))
    expected = (
        f"checkpoint {ckpt} is in checkpoint format 1, which this minillama no longer reads; `git checkout "
        f"{LAST_READER[1]}` reads it (generate, evaluate or export it there), or train anew"
    )
    for load in (lambda: load_model(str(run), verify=verified), lambda: Resume.open(str(run), verify=verified)):
        with pytest.raises(CheckpointError) as refused:
            load()
        assert str(refused.value) == expected
    (ckpt / MANIFEST).unlink()  # before manifests: no tag at all
    with pytest.raises(CheckpointError, match=f"predates manifests \\(format 1: `git checkout {LAST_READER[1]}`"):
        load_model(str(run), verify=verified)


# A checkpoint's file names, spelled only by training/checkpoint.py, so that renaming one is one edit there (and a new
# format version). The same names in other formats are not a checkpoint's files.
CHECKPOINT_FILES = {
    checkpoint_format.WEIGHTS,
    checkpoint_format.MODEL_CONFIG,
    checkpoint_format.TOKENIZER,
    checkpoint_format.OPTIMIZER,
    checkpoint_format.RNG,
    MANIFEST,
}
OTHER_FORMATS = {
    ("data/cache.py", checkpoint_format.TOKENIZER): "the data cache's tokenizer",
    ("interop/hf_export.py", checkpoint_format.WEIGHTS): "a Hugging Face directory's files",
    ("interop/hf_export.py", checkpoint_format.TOKENIZER): "a Hugging Face directory's files",
    ("interop/hf.py", checkpoint_format.WEIGHTS): "a Hugging Face directory's files",
    ("interop/hf.py", checkpoint_format.TOKENIZER): "a Hugging Face directory's files",
    ("dev/bench/checkpoint.py", checkpoint_format.TOKENIZER): "the benchmark's own tokenizer file",
}


def test_no_module_but_the_format_spells_a_checkpoints_file_name():
    owners = {"training/checkpoint.py"}
    assert {value for _, value in literals(REPO / "training" / "checkpoint.py", CHECKPOINT_FILES)} == CHECKPOINT_FILES
    found = [
        f"{name}:{line}: {value!r}"
        for path in CODE
        if (name := str(path.relative_to(REPO))) not in owners
        for line, value in literals(path, CHECKPOINT_FILES)
        if (name, value) not in OTHER_FORMATS
    ]
    assert found == [], "use training/checkpoint.py's names (WEIGHTS, TOKENIZER, …): " + "; ".join(found)


def layout(ckpt: Path) -> dict:
    """A checkpoint's layout without its values: its files; state.json's and model_config.json's fields and their
    types; each weight's name, dtype and shape; the optimizer's and RNG files' trees; the manifest's format."""
    from safetensors import safe_open

    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        weights = {k: (str(f.get_slice(k).get_dtype()), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    return {
        "files": sorted(p.name for p in ckpt.iterdir()),
        "state.json": sorted(json.loads((ckpt / "state.json").read_text())),  # RunState's fields (values: the run's)
        "model_config.json": _tree(json.loads((ckpt / "model_config.json").read_text())),
        "model.safetensors": weights,
        **{name: _tree(torch.load(ckpt / name, weights_only=True)) for name in ("optimizer.pt", "rng.pt")},
        "manifest": json.loads((ckpt / MANIFEST).read_text())["format"],
    }


def _tree(value):
    """A JSON or torch.load value with its leaves replaced by their kinds (tensors: dtype and shape)."""
    if isinstance(value, dict):
        return {str(k): _tree(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_tree(v) for v in value]
    if torch.is_tensor(value):
        return f"tensor {value.dtype} {tuple(value.shape)}"
    return "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__
