"""README.md's two maps — the configuration table and the layout table — match the tree: a config
option or a top-level folder added, renamed or removed without the README fails here."""

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).parents[1]


def _table_rows(heading):
    section = (ROOT / "README.md").read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    assert rows, f"README's {heading} section has no table"
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def _ticked(cell):
    return re.findall(r"`([^`]+)`", cell)


def test_the_configuration_table_lists_every_option_of_every_group():
    rows = {_ticked(row[0])[0]: _ticked(row[1]) for row in _table_rows("Configuration")}
    groups = {
        p.name for p in (ROOT / "configs").iterdir() if p.is_dir() and p.name not in ("protocol", "speedrun")
    }  # the studies' own files, not train.yaml groups
    assert set(rows) == groups
    for group, options in rows.items():
        assert sorted(options) == sorted(p.stem for p in (ROOT / "configs" / group).glob("*.yaml")), group
    defaults = (ROOT / "configs" / "train.yaml").read_text()
    for group, options in rows.items():  # the default is listed first, where the group has one
        match = re.search(rf"^  - {group}: (\w+)", defaults, re.M)
        if match and match.group(1) != "null":
            assert options[0] == match.group(1), f"{group}: the default {match.group(1)} is not first"


def test_the_layout_table_names_every_top_level_folder_and_each_path_exists():
    rows = _table_rows("Layout")
    paths = [_ticked(row[0])[0] for row in rows]
    for path in paths:
        assert (ROOT / path).exists(), f"README's layout names {path}, which is not in the tree"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    folders = {line.split("/")[0] + "/" for line in tracked.splitlines() if "/" in line and not line.startswith(".")}
    assert folders <= set(paths), f"top-level folders missing from README's layout: {folders - set(paths)}"


def test_the_layout_tables_module_lists_are_true():
    """Every module a row names exists in that folder; the model/ row names all of model/'s modules."""
    for row in _table_rows("Layout"):
        folder = _ticked(row[0])[0]
        named = [name for name in _ticked(row[1]) if re.fullmatch(r"[\w/]+(\.py|/)", name)]
        for name in named:
            cross_reference = name.endswith("/") and (ROOT / name).is_dir()  # "doors into `cli/`"
            assert cross_reference or (ROOT / folder / name).exists(), f"README's layout: {folder}{name} does not exist"
        if folder == "model/":
            modules = {p.name for p in (ROOT / "model").glob("*.py") if p.name != "__init__.py"}
            assert set(named) == modules, modules ^ set(named)


def test_the_failure_count_is_the_catalogues():
    """README says how many failures docs/reliability.md lists; a row added there must change the number here."""
    said = re.search(r"docs/reliability\.md\)? lists (\d+) of them", (ROOT / "README.md").read_text())
    rows = re.findall(r"^\| \d+ \|", (ROOT / "docs" / "reliability.md").read_text(), flags=re.M)
    assert said and int(said.group(1)) == len(rows)


def test_the_docs_stay_short_enough_to_finish():
    """README ≤ 150 lines, BENCHMARKS.md and each page under docs/ ≤ 300, all tracked Markdown ≤ 2,500 (issue 62):
    the current facts, with history left to git."""
    tracked = subprocess.run(["git", "ls-files", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True)
    pages = {p: len((ROOT / p).read_text().splitlines()) for p in tracked.stdout.split()}
    assert pages["README.md"] <= 150 and pages["BENCHMARKS.md"] <= 300
    assert not {p: n for p, n in pages.items() if p.startswith("docs/") and n > 300}
    assert sum(pages.values()) <= 2500, sum(pages.values())
