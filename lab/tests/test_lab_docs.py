"""Every `python -m lab.…` and `python -m dev.…` command README.md and docs/ show is accepted by its program's parser
(the lab's studies train for hours: a renamed or mistyped flag fails here), and the lab's dry runs run as written,
writing nothing."""

import re

import pytest

from tests.doc_commands import fenced_python_commands, has_placeholder
from tests.test_docs_scripts import Parsed, arguments, parse_only, program
from training.program import exit_status

COMMANDS = [(where, words) for where, words in fenced_python_commands() if words[0] == "-m"]
DRY = [(where, words) for where, words in COMMANDS if "--dry-run" in words and not has_placeholder(words)]
DRY = [(where, words) for where, words in DRY if words[1] == "lab.ablate"]


def test_the_docs_show_lab_and_dev_commands():
    modules = {words[1] for _, words in COMMANDS}
    assert {"lab.ablate", "lab.coord_check", "lab.mup_transfer", "dev.bench"} <= modules and len(DRY) >= 1


@pytest.mark.parametrize("where, words", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_lab_or_dev_command_is_accepted_by_its_program(monkeypatch, where, words):
    main = program(words)
    argv = [re.sub(r"<[^>]*>", "x", w) for w in arguments(words)]
    parse_only(monkeypatch)
    with pytest.raises(Parsed):
        main(argv)


@pytest.mark.parametrize("where, words", DRY, ids=[w for w, _ in DRY])
def test_a_documented_dry_run_runs_as_written_and_writes_nothing(tmp_path, monkeypatch, where, words):
    monkeypatch.chdir(tmp_path)
    assert exit_status(program(words), arguments(words)) == 0
    assert list(tmp_path.iterdir()) == []
