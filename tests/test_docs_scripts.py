"""Every `python scripts/….py` command README.md and docs/ show works as written.

The ones a newcomer runs first, and that finish in seconds — README's generation block (generate, evaluate,
export, import), the model summary, estimate, data preparation, the dry runs — run as written, in order, in a
directory that holds a trained run (a tiny one stands in for `make train`'s), and each must exit 0; a dry run
must also leave the directory as it found it. The rest train for minutes to hours (ablate, speedrun, the μP
experiments, benchmarks): their arguments must be accepted by their program's own parser, which is where a
renamed or mistyped flag fails. A command with a placeholder (`<run>`) is parsed with the placeholder filled.
"""

import argparse
import importlib
import re
import shutil

import pytest

from data.sources import load_plays
from tests.doc_commands import fenced_python_commands, has_placeholder
from tests.train_helpers import train_in_process
from training.program import exit_status

pytestmark = pytest.mark.serial  # trains a tiny run, then runs the commands on it

COMMANDS = [(where, words) for where, words in fenced_python_commands() if words[0].startswith("scripts/")]
# Run as written: quick, and what a newcomer tries first. Dry runs that train nothing are quick too.
RUN = {"generate", "evaluate", "export_hf", "import_hf", "model_summary", "estimate", "prepare_data"}
DRY = set()  # the lab's dry runs: lab/tests/test_lab_docs.py


def runs_as_written(words: list) -> bool:
    name = words[0].removeprefix("scripts/").removesuffix(".py")
    return not has_placeholder(words) and (name in RUN or (name in DRY and "--dry-run" in words))


def program(words: list):
    """The `main` of the program a command runs: scripts/x.py's, `-m lab.x`'s, or `-m dev.bench NAME`'s."""
    if words[0] == "-m":
        module = words[1] + (f".{words[2]}" if words[1] == "dev.bench" else "")
    else:
        module = "scripts." + words[0].removeprefix("scripts/").removesuffix(".py")
    return importlib.import_module(module).main


def arguments(words: list) -> list:
    """What the program's main parses: the words after the script or module (and a benchmark's name)."""
    return words[(3 if words[1] == "dev.bench" else 2) if words[0] == "-m" else 1 :]


class Parsed(Exception):
    """Raised in place of running a program once its parser has accepted the command line."""


def parse_only(monkeypatch):
    """Make every argparse parser stop its program once its outermost parse returns: an unknown flag or a bad
    value still exits 2, as on the command line (parse_args checks for leftovers after its inner calls)."""
    depth = [0]
    for name in ("parse_args", "parse_known_args", "parse_intermixed_args", "parse_known_intermixed_args"):

        def parse(self, *args, _original=getattr(argparse.ArgumentParser, name), **kwargs):
            depth[0] += 1
            try:
                result = _original(self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise Parsed(result)
            return result

        monkeypatch.setattr(argparse.ArgumentParser, name, parse)


def test_a_mistyped_flag_or_value_still_fails_when_only_parsing(monkeypatch, capsys):
    """The check can fail: each kind of parse (speedrun's is intermixed) still refuses what the shell would."""
    parse_only(monkeypatch)
    for words in (
        ["scripts/generate.py", "latest", "--max-tokens", "5"],
        ["scripts/evaluate.py", "latest", "--batch-size", "x3"],
    ):
        with pytest.raises(SystemExit) as exit:
            program(words)(arguments(words))
        assert exit.value.code == 2 and "error: " in capsys.readouterr().err, words
    with pytest.raises(Parsed):
        program(["scripts/generate.py"])(["latest", "--max-new-tokens", "3"])


PARSED = [(where, words) for where, words in COMMANDS if not runs_as_written(words)]
RUNS = [(where, words) for where, words in COMMANDS if runs_as_written(words)]


def test_the_docs_show_script_commands():
    """The collection works: README's and docs/'s examples of every kind are found."""
    assert len(COMMANDS) >= 15 and len(RUNS) >= 12
    assert {w[0] for _, w in RUNS} >= {f"scripts/{name}.py" for name in RUN | DRY}


@pytest.mark.parametrize("where, words", PARSED, ids=[w for w, _ in PARSED])
def test_a_documented_long_command_is_accepted_by_its_program(monkeypatch, where, words):
    main = program(words)
    argv = [re.sub(r"<[^>]*>", "x", w) for w in arguments(words)]  # a placeholder, filled as a reader would
    parse_only(monkeypatch)
    with pytest.raises(Parsed):  # not SystemExit(2): argparse's `error: unrecognized arguments` / `invalid …`
        main(argv)


@pytest.fixture
def newcomer(tmp_path, tiny_data_cache, monkeypatch):
    """A working directory as `make train` leaves it (a tiny run under outputs/, with a best checkpoint),
    plus the text files docs/training.md's preparation example names (`my/*.txt`)."""
    train_in_process(
        tmp_path / "outputs" / "2026-12-03" / "12-00-00", "trainer.max_steps=20", cache_dir=tiny_data_cache
    )
    (tmp_path / "my").mkdir()
    for i, play in enumerate(load_plays()[:2]):
        (tmp_path / "my" / f"{i}.txt").write_text(play["text"])
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_quick_documented_commands_run_as_written(newcomer, capsys):
    done = set()
    for where, words in RUNS:  # in the docs' order: README's export comes before its import
        if tuple(words) in done:  # the same command in two documents: once
            continue
        done.add(tuple(words))
        before = sorted(p for p in newcomer.rglob("*"))
        status = exit_status(program(words), arguments(words))
        out, err = capsys.readouterr()
        assert status == 0, f"{where}: python {' '.join(words)} exited {status}: {err.strip()[-500:]}"
        if "--dry-run" in words:
            assert sorted(newcomer.rglob("*")) == before, f"{where}: a dry run wrote files"
    assert (newcomer / "hf" / "config.json").is_file() and (newcomer / "imported").is_dir()
    shutil.rmtree(newcomer / "data_cache")  # prepare_data's cache, ~1 MB: not kept past the test


def test_the_collection_joins_continued_lines_and_skips_prose(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "python scripts/a.py in prose\n```bash\npython scripts/a.py --x 1 \\\n    --y 2   # both\n"
        ".venv/bin/python -m pytest -q\n```\n"
    )
    assert fenced_python_commands([doc]) == [("x.md:3", ["scripts/a.py", "--x", "1", "--y", "2"])]
