"""BENCHMARKS.md, one `## ` section per benchmark script: replace a script's own section, keep the rest."""

from pathlib import Path


def write_section(path: Path, heading: str, body: str) -> None:
    """Replace the section that starts with the line `heading` (up to the next `## ` line), or append
    it. Other scripts own the other sections, and hand-written prose between them stays as it is."""
    if not heading.startswith("## "):
        raise ValueError(f"heading {heading!r} must be a level-2 Markdown heading ('## ...')")
    path = Path(path)
    lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else ["# Benchmarks"]
    section = [heading, "", *body.strip("\n").splitlines(), ""]
    if heading in lines:
        start = lines.index(heading)
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        lines[start:end] = section
    else:
        lines += ["", *section]
    path.write_text("\n".join(lines).rstrip("\n") + "\n", encoding="utf-8")
