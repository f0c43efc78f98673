"""training/cli.py: a program's --help description is its docstring's whole first paragraph; an environment variable
that would break torch's import is one `error:` line before any program starts (docs/reliability.md row 97)."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from training import inductor_cache_problem
from training.program import description

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = sorted(
    p
    for pkg in ("scripts", "lab", "dev")
    for p in (REPO / pkg).rglob("*.py")
    if "tests" not in p.parts and "description(__doc__)" in p.read_text()
)


def test_the_description_is_the_first_paragraph_on_one_line():
    assert (
        description("Train a model on\n  the corpus, for a while.\n\nUsage: ...\n")
        == "Train a model on the corpus, for a while."
    )


def test_no_program_cuts_its_description_at_the_first_line():
    cut = [
        str(p.relative_to(REPO))
        for pkg in ("scripts", "lab", "dev")
        for p in (REPO / pkg).rglob("*.py")
        if "__doc__.splitlines()[0]" in p.read_text()
    ]
    assert cut == []


@pytest.mark.parametrize("path", PROGRAMS, ids=[str(p.relative_to(REPO)) for p in PROGRAMS])
def test_every_programs_description_ends_a_sentence(path):
    """`scripts/x.py --help` once stopped mid-sentence ("… vs Hugging Face"), where the docstring wrapped."""
    module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
    text = description(module.__doc__)
    assert text.endswith((".", ")", "?", ":")) and len(text) > 20, text


# ---- TORCHINDUCTOR_CACHE_DIR, checked when training/ is imported ----------------------------------------------


def run_with_cache_dir(folder, *argv) -> subprocess.CompletedProcess:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(folder), "WANDB_MODE": "disabled"}
    return subprocess.run([sys.executable, *argv], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_a_cache_folder_torch_cannot_create_is_one_line_from_train_py_and_every_script(tmp_path):
    """Importing the model imports torch._dynamo, which creates TORCHINDUCTOR_CACHE_DIR: a file there was a
    30-line traceback from inside torch. Now: one line naming the variable and why, exit status 1, the file
    untouched — from train.py (before Hydra starts) and from a script alike."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    for folder, argv, why in (
        (a_file, ["train.py", "debug=tiny"], "file exists"),
        (a_file / "cache", ["scripts/generate.py", "--help"], "not a directory"),
    ):
        out = run_with_cache_dir(folder, *argv)
        assert out.returncode == 1 and out.stdout == "", out.stderr[-2000:]
        assert out.stderr == (
            f"error: TORCHINDUCTOR_CACHE_DIR={folder} cannot hold torch.compile's cache ({why}); "
            "point it at a folder you can write, or unset it\n"
        )
    assert a_file.read_text() == "mine"


def test_a_usable_or_unset_cache_folder_passes_and_is_created_as_torch_would(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    assert inductor_cache_problem() is None
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "new" / "cache"))
    assert inductor_cache_problem() is None and (tmp_path / "new" / "cache").is_dir()
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # as a user without write access (tests run as root)
    assert "(it is not writable)" in inductor_cache_problem()


@pytest.mark.parametrize("name", ["train.py", "scripts/evaluate.py"])
def test_the_programs_start_with_a_usable_cache_folder(tmp_path, name):
    """The check lets a good folder through: --help answers as before (exit 0)."""
    out = run_with_cache_dir(tmp_path / "cache", name, "--help")
    assert out.returncode == 0, out.stderr[-2000:]
