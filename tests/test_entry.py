"""cli/entry.py: a program's --help description is its docstring's whole first paragraph."""
import importlib
from pathlib import Path

import pytest

from cli.entry import description

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = sorted(p for pkg in ("cli", "devtools") for p in (REPO / pkg).rglob("*.py")
                  if "description(__doc__)" in p.read_text())


def test_the_description_is_the_first_paragraph_on_one_line():
    assert description("Train a model on\n  the corpus, for a while.\n\nUsage: ...\n") == \
        "Train a model on the corpus, for a while."


def test_no_program_cuts_its_description_at_the_first_line():
    cut = [str(p.relative_to(REPO)) for pkg in ("cli", "devtools") for p in (REPO / pkg).rglob("*.py")
           if "__doc__.splitlines()[0]" in p.read_text()]
    assert cut == []


@pytest.mark.parametrize("path", PROGRAMS, ids=[str(p.relative_to(REPO)) for p in PROGRAMS])
def test_every_programs_description_ends_a_sentence(path):
    """`scripts/x.py --help` once stopped mid-sentence ("… vs Hugging Face"), where the docstring wrapped."""
    module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
    text = description(module.__doc__)
    assert text.endswith((".", ")", "?", ":")) and len(text) > 20, text
