"""The docs' test references are real: every `test_x::test_y` (or `tests/test_x.py::test_y`) that
docs/testing.md's promise map and docs/reliability.md name is a test function defined at module level in
tests/test_x.py (parametrized or not), every `tests/test_x.py` they name exists, the promise map has a
test for each of its (at least 30) rows, and the reliability catalogue is numbered 1, 2, 3, … without a
gap. Reads the files with `ast`: nothing is imported or run, so a renamed or deleted test fails here at
once, not when someone follows a dead link."""

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TESTING, RELIABILITY = REPO / "docs" / "testing.md", REPO / "docs" / "reliability.md"
PROMISE_MAP = "## The promise map"
MIN_PROMISES = 30

# `test_faults::test_kill9_…`, `tests/test_faults.py::test_kill9_…`, `test_faults.py::test_kill9_…`
TEST_REF = re.compile(r"(?<![\w/])(?:tests/)?(test_\w+?)(?:\.py)?::(test_\w+)")
TEST_FILE = re.compile(r"(?<![\w/])tests/(test_\w+)\.py\b")


def candidate_files(module: str) -> list:
    return [REPO / folder / f"{module}.py" for folder in ("tests", "lab/tests", "dev/tests")]


@lru_cache(maxsize=None)
def functions_in(module: str) -> frozenset:
    """Names of the functions defined at module level in <module>.py of tests/, lab/tests/ or dev/tests/ (empty if
    there is no such file)."""
    path = next((p for p in candidate_files(module) if p.is_file()), None)
    if path is None:
        return frozenset()
    tree = ast.parse(path.read_text(), filename=str(path))
    return frozenset(node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)))


def table_rows(text: str) -> list:
    """The cells of each body row of the first markdown table in `text` (header and separator left out)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    assert len(rows) >= 2 and set(rows[1][0]) <= set("-: "), "the promise map is not a markdown table"
    return rows[2:]


def promise_map_rows() -> list:
    text = TESTING.read_text()
    assert PROMISE_MAP in text, f"docs/testing.md has no '{PROMISE_MAP}' section"
    return table_rows(text.split(PROMISE_MAP, 1)[1])


def missing(refs) -> list:
    """The (module, function) references that name no module-level function of an existing test file."""
    return sorted({(m, f) for m, f in refs if f not in functions_in(m)})


def test_the_promise_map_has_at_least_30_promises_each_with_a_test_that_exists():
    rows = promise_map_rows()
    assert len(rows) >= MIN_PROMISES, f"the promise map has {len(rows)} rows, fewer than {MIN_PROMISES}"
    for row in rows:
        assert len(row) == 3, f"a promise-map row needs promise | where | test: {row}"
        assert TEST_REF.search(row[2]), f"this promise names no test: {row[0]}"
    refs = [m.groups() for row in rows for m in TEST_REF.finditer(row[2])]
    assert not missing(refs), f"the promise map names tests that do not exist: {missing(refs)}"


@pytest.mark.parametrize("doc", [TESTING, RELIABILITY], ids=lambda p: p.name)
def test_every_test_the_doc_names_exists(doc):
    text = doc.read_text()
    refs = [m.groups() for m in TEST_REF.finditer(text)]
    assert len(refs) >= 30, f"{doc.name}: only {len(refs)} test references found: is the pattern still right?"
    assert not missing(refs), f"{doc.name} names tests that do not exist: {missing(refs)}"
    files = {m.group(1) for m in TEST_FILE.finditer(text)}
    assert not sorted(f for f in files if not any(p.is_file() for p in candidate_files(f))), (
        f"{doc.name} names test files that do not exist"
    )


def test_the_reliability_catalogue_is_numbered_without_gaps():
    numbers = [int(m.group(1)) for m in re.finditer(r"^\| (\d+) \|", RELIABILITY.read_text(), flags=re.M)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers


def test_the_reference_checker_sees_a_test_that_does_not_exist():
    """The control: a bogus name in either form is reported, a real (parametrized) one is not."""
    text = (
        "`test_faults::test_kill9_at_random_steps_then_resume_is_bitwise_identical`, "
        "`tests/test_step.py::test_a_nonfinite_step_leaves_weights_and_optimizer_state_untouched`, "
        "`test_faults::test_no_such_test`, `tests/test_no_such_file.py::test_anything`"
    )
    refs = [m.groups() for m in TEST_REF.finditer(text)]
    assert len(refs) == 4
    assert missing(refs) == [("test_faults", "test_no_such_test"), ("test_no_such_file", "test_anything")]
