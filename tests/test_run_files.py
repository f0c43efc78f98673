"""training/checkpoint.py: the one module that names a run directory's files; no other module spells them."""

import ast
from pathlib import Path

import pytest

import training.checkpoint as F
from training.checkpoint import RunFiles

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("model", "data", "training", "interop", "analysis", "scripts", "lab", "dev")
CODE = [
    REPO / "train.py",
    *(p for pkg in PACKAGES for p in sorted((REPO / pkg).rglob("*.py")) if "tests" not in p.parts),
]
OWNER = REPO / "training" / "checkpoint.py"  # the module that names them
NAMES = (F.CONFIG, F.METRICS, F.JOB_STATUS, F.CLAIM, F.CHECKPOINTS, F.STATE)  # a run directory's files
# The same name in another format, not a run's file: `datasets.save_to_disk` writes a state.json of its own.
NOT_A_RUN_FILE = {("data/sources.py", F.STATE)}


def literals(path: Path, names=NAMES) -> list:
    """(line, string) of every string constant in the file that is exactly one of `names` (a run's file names)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names
    ]


def test_no_module_but_the_checkpoint_module_spells_a_run_files_name():
    assert OWNER in CODE and {value for _, value in literals(OWNER)} == set(NAMES)  # the one that spells them
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in CODE
        if path != OWNER
        for line, value in literals(path)
        if (str(path.relative_to(REPO)), value) not in NOT_A_RUN_FILE
    ]
    assert found == [], "use training/checkpoint.py's names (RunFiles, CONFIG, METRICS, …): " + "; ".join(found)


def test_the_scan_sees_a_literal_and_an_f_string_part_is_not_one(tmp_path):
    """The check above can fail: a name written as a literal is found; a message that mentions one is not."""
    module = tmp_path / "m.py"
    module.write_text('p = run / "metrics.jsonl"\nmessage = f"{run}/metrics.jsonl is cut off"\n')
    assert literals(module) == [(1, "metrics.jsonl")]


def test_every_path_of_a_run_directory(tmp_path):
    files = RunFiles(str(tmp_path))
    assert (files.config, files.metrics, files.job_status, files.claim, files.checkpoints) == (
        tmp_path / "config.yaml",
        tmp_path / "metrics.jsonl",
        tmp_path / "job_status.yaml",
        tmp_path / ".owner",
        tmp_path / "checkpoints",
    )
    assert not files.holds_run()
    files.config.write_text("model: {n_layers: 2}\ntrainer: {}\n")
    assert files.read_config() == {"model": {"n_layers": 2}, "trainer": {}} and not files.holds_run()
    files.metrics.write_text("")
    assert files.holds_run()


def test_a_checkpoint_holds_the_runs_config_under_the_same_name(tmp_path):
    (tmp_path / F.CONFIG).write_text("data: {source: shakespeare}\n")
    assert RunFiles(tmp_path).read_config() == {"data": {"source": "shakespeare"}}
    with pytest.raises(OSError):
        RunFiles(tmp_path / "missing").read_config()
