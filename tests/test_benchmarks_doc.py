"""analysis/benchmarks_doc.py: a benchmark rewrites only its own BENCHMARKS.md section."""

import pytest

from analysis.benchmarks_doc import write_section

DOC = """# Benchmarks

Intro prose.

## Alpha

old alpha
| a | b |

## Beta (scripts/beta.py)

beta body mentions ## Alpha inline
"""


def test_replaces_only_its_own_section(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    path.write_text(DOC)
    write_section(path, "## Alpha", "new alpha\n")
    text = path.read_text()
    assert "old alpha" not in text and "| a | b |" not in text
    assert text.startswith("# Benchmarks\n\nIntro prose.\n\n## Alpha\n\nnew alpha\n\n## Beta (scripts/beta.py)\n")
    assert text.endswith("beta body mentions ## Alpha inline\n")
    write_section(path, "## Beta (scripts/beta.py)", "beta v2")  # the last section: replaced to the end
    assert path.read_text().endswith("## Beta (scripts/beta.py)\n\nbeta v2\n") and "new alpha" in path.read_text()


def test_appends_a_new_section_and_creates_the_file(tmp_path):
    path = tmp_path / "BENCHMARKS.md"
    write_section(path, "## Gamma", "g")
    assert path.read_text() == "# Benchmarks\n\n## Gamma\n\ng\n"
    write_section(path, "## Delta", "d")
    write_section(path, "## Gamma", "g2")
    assert path.read_text() == "# Benchmarks\n\n## Gamma\n\ng2\n\n## Delta\n\nd\n"


def test_rejects_a_heading_that_would_not_delimit_a_section(tmp_path):
    with pytest.raises(ValueError, match="level-2"):
        write_section(tmp_path / "B.md", "### Too deep", "x")
