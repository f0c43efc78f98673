"""Byte-level BPE: special tokens first, exact round trip for any unicode, clear errors for bad files;
the special-token roles file that travels with a tokenizer; the largest id."""

import json
import random

import pytest

from data import SPECIAL_TOKENS, DataError, load_tokenizer
from data.tokenizer import (
    MIN_VOCAB_SIZE,
    SPECIAL_TOKENS_FILE,
    file_hash,
    max_token_id,
    read_special_tokens,
    special_token_ids,
    token_ids,
    train_tokenizer,
    write_special_tokens,
)
from tests.data_helpers import make_documents


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([make_documents(300)], vocab_size=512)


def random_unicode(rng: random.Random, length: int) -> str:
    """Code points from ASCII, Latin, CJK, emoji, combining marks, controls and whitespace runs."""
    ranges = [
        (0x0, 0x7F),
        (0x80, 0x24F),
        (0x300, 0x36F),
        (0x4E00, 0x9FFF),
        (0x1F300, 0x1FAFF),
        (0x10000, 0x10FFF),
        (0xE000, 0xF8FF),
    ]
    chars = []
    for _ in range(length):
        low, high = rng.choice(ranges)
        chars.append(chr(rng.randint(low, high)))
        if rng.random() < 0.1:
            chars.append(rng.choice(["  ", "\n", "\r\n", "\t", " "]))
    return "".join(chars)


def test_special_tokens_take_ids_0_1_2(tokenizer):
    assert special_token_ids(tokenizer) == {"bos_id": 0, "eos_id": 1, "pad_id": 2}
    assert [tokenizer.id_to_token(i) for i in range(3)] == list(SPECIAL_TOKENS.values())
    assert tokenizer.get_vocab_size() == 512


def test_round_trip_arbitrary_unicode(tokenizer):
    rng = random.Random(0)
    texts = [random_unicode(rng, rng.randint(0, 60)) for _ in range(300)]
    texts += ["", " leading space", "trailing  ", "\n\n", "naïve café 東京 🦙", "\x00\x1f\x7f", "a" * 1000]
    for text in texts:
        assert tokenizer.decode(tokenizer.encode(text).ids) == text, repr(text)


def test_encoding_adds_no_special_tokens(tokenizer):
    ids = tokenizer.encode("Document 1. the water").ids
    assert ids and not set(ids) & {0, 1, 2}
    assert tokenizer.encode("").ids == []


def test_bpe_merges_common_words(tokenizer):
    # A trained tokenizer compresses its own corpus well below one token per byte.
    text = make_documents(5, seed=1)[0]
    assert len(tokenizer.encode(text).ids) < len(text.encode("utf-8")) / 2


def test_vocab_too_small_for_bytes_and_special_tokens():
    assert MIN_VOCAB_SIZE == 259
    with pytest.raises(DataError, match=r"vocab_size=258 .*data.vocab_size>=259"):
        train_tokenizer([["hello"]], vocab_size=258)
    assert train_tokenizer([["hello"]], vocab_size=259).get_vocab_size() == 259


def test_save_load_and_hash(tmp_path, tokenizer):
    path = tmp_path / "tokenizer.json"
    tokenizer.save(str(path))
    loaded = load_tokenizer(path)
    assert loaded.encode("the water café").ids == tokenizer.encode("the water café").ids
    # The hash is of the content: a byte-identical copy elsewhere has it, one more byte does not.
    copy = tmp_path / "elsewhere" / "tokenizer.json"
    copy.parent.mkdir()
    copy.write_bytes(path.read_bytes())
    assert file_hash(copy) == file_hash(path) and len(file_hash(path)) == 16
    edited = tmp_path / "edited.json"
    content = path.read_bytes()
    edited.write_bytes(content + b" ")  # the same JSON, another file
    assert file_hash(edited) != file_hash(path)
    # A tokenizer trained to another vocabulary is another identity (another data cache).
    other = tmp_path / "other.json"
    train_tokenizer([make_documents(300)], vocab_size=400).save(str(other))
    assert file_hash(other) != file_hash(path)


def test_missing_and_invalid_tokenizer_files(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    with pytest.raises(DataError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)


def test_tokenizer_without_our_special_tokens_is_refused(tmp_path, tokenizer):
    raw = json.loads(tokenizer.to_str())
    raw["added_tokens"] = [t for t in raw["added_tokens"] if t["content"] != "<|eos|>"]
    del raw["model"]["vocab"]["<|eos|>"]
    path = tmp_path / "no_eos.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(DataError, match=r"no '<\|eos\|>' token"):
        special_token_ids(load_tokenizer(path), str(path))


def test_special_tokens_file_round_trips_and_defaults_to_ours(tmp_path, tokenizer):
    assert read_special_tokens(tmp_path) == SPECIAL_TOKENS  # no file: a tokenizer minillama trained
    roles = {"bos": None, "eos": "<|pad|>", "pad": None}  # e.g. an imported model's choice
    write_special_tokens(tmp_path, roles)
    assert read_special_tokens(tmp_path) == roles
    assert token_ids(tokenizer, roles) == {"bos": None, "eos": 2, "pad": None}
    # The data pipeline accepts other roles as long as EOS exists: documents must end.
    assert special_token_ids(tokenizer, roles=roles) == {"bos_id": None, "eos_id": 2, "pad_id": None}
    with pytest.raises(DataError, match="no end-of-document token"):
        special_token_ids(tokenizer, roles={"bos": "<|bos|>", "eos": None, "pad": None})
    with pytest.raises(DataError, match="no '</s>' token"):
        special_token_ids(tokenizer, roles={"bos": None, "eos": "</s>", "pad": None})


@pytest.mark.parametrize("content", ["{ not json", '{"bos": "<s>"}', '{"bos": 1, "eos": "x", "pad": null}', "[]"])
def test_a_damaged_special_tokens_file_is_a_clear_error(tmp_path, content):
    (tmp_path / SPECIAL_TOKENS_FILE).write_text(content)
    with pytest.raises(DataError, match=SPECIAL_TOKENS_FILE):
        read_special_tokens(tmp_path)


def test_max_token_id_counts_added_tokens(tokenizer):
    assert max_token_id(tokenizer) == tokenizer.get_vocab_size() - 1 == 511
    grown = train_tokenizer([make_documents(300)], vocab_size=512)
    grown.add_special_tokens(["<|extra|>"])
    assert max_token_id(grown) == 512
