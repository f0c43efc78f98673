"""The commands README.md and docs/ show in their code blocks, as a reader would copy them: what
tests/test_docs_commands.py (train.py) and tests/test_docs_scripts.py (scripts/) check."""

import re
import shlex
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def fenced_python_commands(paths=DOCS) -> list:
    """(where, words) of each `python …` command in a code block (`.venv/bin/python` too; `python -m` only for the lab's
    and dev/'s programs), a line continued with a backslash joined to the next, its comment dropped; words: what follows
    `python`. A `torchrun … train.py`
    line counts as the `python train.py` each of its ranks runs (torchrun's own options dropped)."""
    found = []
    for path in paths:
        in_code, lines = False, path.read_text().splitlines()
        where = path.relative_to(REPO) if REPO in path.parents else path.name
        number = 0
        while number < len(lines):
            line, start = lines[number], number + 1
            number += 1
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            while in_code and line.rstrip().endswith("\\") and number < len(lines):
                line, number = line.rstrip()[:-1] + " " + lines[number].strip(), number + 1
            command = re.sub(r"^\s*(\.venv/bin/)?python ", "python ", line)
            command = re.sub(r"^\s*torchrun\s(.*?\s)?train\.py\b", "python train.py", command)
            program = command.startswith("python ") and (
                not command.startswith("python -") or re.match(r"python -m (lab|dev)\.", command)
            )
            if in_code and program:  # a script, train.py, or a program of the lab or dev/ (`python -m lab.ablate`)
                found.append((f"{where}:{start}", shlex.split(command, comments=True)[1:]))
    return found


def has_placeholder(words: list) -> bool:
    """A word a reader replaces: `<run>`, `multirun/<date>/<time>`, `…`."""
    return any("<" in w or "…" in w for w in words)
