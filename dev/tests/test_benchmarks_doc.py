"""analysis/benchmarks_doc.py: a benchmark rewrites only its own BENCHMARKS.md section."""

import pytest

from dev.bench.benchmarks_doc import write_section

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


def test_the_sampling_switch_claims_only_what_its_paired_seeds_show():
    """BENCHMARKS.md's random-vs-epochs table: each Δ is its row's epochs − random, every pair favours epochs (the
    sentence's claim), and no page calls two seeds without a margin a tested "no worse"."""
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    text = (repo / "BENCHMARKS.md").read_text()
    section = text.split("## Drawing windows: random or epochs", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[3:6] for line in section.splitlines() if line.startswith("| `") or "600 steps |" in line]
    assert len(rows) == 2
    for random_, epochs, deltas in rows:
        pairs = zip(*(map(float, cell.replace("−", "-").split(",")) for cell in (random_, epochs, deltas)))
        assert all(round(e - r, 3) == d < 0 for r, e, d in pairs)
    assert 'not a tested "no worse"' in " ".join(section.split()) and "Every pair favours `epochs`" in section
    for page in ("BENCHMARKS.md", "docs/training.md", "README.md"):
        assert (
            "showed it no worse" not in (repo / page).read_text() and "enough to say" not in (repo / page).read_text()
        )
