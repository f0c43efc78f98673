"""data/cache.py's fast path: tiktoken gives the ids `tokenizers` gives, on trained
vocabularies of several sizes and text of every kind; a tokenizer of another shape is refused with its reason;
a cache built through the fast path is byte for byte the one `tokenizers` builds; and where the two would
differ, the split is encoded by `tokenizers` after all."""

import json
import random

import numpy as np
import pytest

import data.cache
from data import DataConfig, prepare
from data.cache import fast_encoder, fast_ids
from data.sources import load_plays
from data.tokenizer import load_tokenizer, train_tokenizer
from tests.data_helpers import REPO, make_documents, write_local

# Text of every kind a corpus brings: prose, code, digits in several scripts, letters outside Latin, emoji,
# runs of whitespace and of one character, contractions, and our special tokens written in the text.
ODD = [
    "naïve café — 日本語のテキスト 1234567 ١٢٣ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 🙂🙃 \t\t  \n\n\n   x",
    "aaaaaaaaaaaaaaaaaaaaaaaaa bbbbbbbbbbb",
    "<|eos|> inside <|bos|>text<|pad|>",
    "  leading",
    "trailing   \n",
    "'s 're 'VE 'll 'd don't",
    "x" * 3000,
    "\r\n\r\n",
    " ",
    "Ⅻ ½ ² ℕ ǅ ＡＢＣ",
    "مرحبا بالعالم",
    "Привет, мир!",
    "a\u0301e\u0301 combining",
    "\u200bzero\u200dwidth",
]


def corpus() -> list:
    code = [p.read_text() for p in sorted((REPO / "training").rglob("*.py"))]
    plays = [p["text"][:20000] for p in load_plays()[:12]]
    return code + plays + ODD + make_documents(50)


@pytest.mark.parametrize("vocab_size", [300, 1024, 4096])
def test_tiktoken_gives_the_ids_tokenizers_gives(tmp_path, vocab_size):
    texts = corpus()
    rng = random.Random(vocab_size)
    train_tokenizer(iter([rng.sample(texts, len(texts) // 2)]), vocab_size).save(str(tmp_path / "tokenizer.json"))
    fast, why = fast_encoder(tmp_path / "tokenizer.json")
    assert fast is not None, why
    expected = [e.ids for e in load_tokenizer(tmp_path / "tokenizer.json").encode_batch(texts)]
    assert [fast_ids(fast, text).tolist() for text in texts] == expected  # as the writer calls it
    assert expected[len(texts) - len(ODD) - 50 + 2][0] == 1  # "<|eos|>" in the text is the EOS token, in both


@pytest.mark.parametrize(
    "change, reason",
    [
        (lambda s: s.update(normalizer={"type": "NFC"}), "normalizer"),
        (lambda s: s["pre_tokenizer"].update(add_prefix_space=True), "add_prefix_space"),
        (lambda s: s["model"].update(dropout=0.1), "dropout"),
        (lambda s: s["model"].update(type="WordPiece"), "model=WordPiece"),
        (lambda s: s["added_tokens"][0].update(lstrip=True), "strips spaces"),
        (lambda s: s["model"].update(merges=s["model"]["merges"][::-1]), "merges are not in the order"),
    ],
)
def test_a_tokenizer_of_another_shape_is_encoded_by_tokenizers(tmp_path, change, reason):
    spec = json.loads(train_tokenizer(iter([make_documents(50)]), 300).to_str())
    change(spec)
    (tmp_path / "tokenizer.json").write_text(json.dumps(spec))
    fast, why = fast_encoder(tmp_path / "tokenizer.json")
    assert fast is None and reason in why


def prepared(tmp_path, name, monkeypatch=None, **overrides):
    documents = [*make_documents(300), "", "   ", *ODD, *make_documents(200, seed=1)]
    path = write_local(tmp_path / "in", documents, "jsonl")
    messages = []
    cfg = DataConfig(source="local", path=path, vocab_size=400, cache_dir=str(tmp_path / name), **overrides)
    return prepare(cfg, log=messages.append), messages


@pytest.mark.parametrize("budget, encode_bytes", [(None, 4 << 20), (5000, 4 << 20), (None, 2000)])
def test_a_cache_from_the_fast_path_is_the_one_tokenizers_builds(tmp_path, monkeypatch, budget, encode_bytes):
    monkeypatch.setattr(data.cache, "ENCODE_BYTES", encode_bytes)  # 2000: a batch in many calls, as a big corpus
    fast, messages = prepared(tmp_path, "fast", token_budget=budget)
    assert fast.meta["train_encoder"] == fast.meta["val_encoder"] == "tiktoken" and any(
        "encoding with tiktoken" in m for m in messages
    )
    monkeypatch.setattr(data.cache, "fast_encoder", lambda path: (None, "switched off by the test"))
    slow, messages = prepared(tmp_path, "slow", token_budget=budget)
    assert (
        slow.meta["train_encoder"] == "tokenizers"
        and "data: encoding with tokenizers: switched off by the test" in messages
    )
    for split in ("train.bin", "val.bin"):
        assert (fast.dir / split).read_bytes() == (slow.dir / split).read_bytes()
    counts = [f"{s}_{f}" for s in ("train", "val") for f in ("tokens", "bytes", "documents", "dropped")]
    assert {k: fast.meta[k] for k in counts} == {k: slow.meta[k] for k in counts}
    if budget is None:  # "", "   ", " " and "\r\n\r\n" have no text
        assert fast.meta["train_dropped"] + fast.meta["val_dropped"] == 4
    else:  # the budget cuts the split after the document that reaches it
        assert budget <= fast.meta["train_tokens"] < 2 * budget


def test_where_the_two_would_differ_the_split_is_encoded_by_tokenizers(tmp_path, monkeypatch):
    """A fast encoder that disagrees on the first documents is caught there: the files are tokenizers' own."""
    real = data.cache.fast_encoder

    class OffByOne:
        def __init__(self, encoding):
            self.encoding = encoding

        def encode_to_numpy(self, text, **kwargs):
            return self.encoding.encode_to_numpy(text, **kwargs) + 1

    monkeypatch.setattr(data.cache, "fast_encoder", lambda path: (OffByOne(real(path)[0]), ""))
    caught, messages = prepared(tmp_path, "caught")
    assert sum("differ from tokenizers'" in m for m in messages) == 2  # train and val, each checked
    assert caught.meta["train_encoder"] == caught.meta["val_encoder"] == "tokenizers"
    monkeypatch.setattr(data.cache, "fast_encoder", lambda path: (None, "off"))
    slow, _ = prepared(tmp_path, "slow")
    assert (caught.dir / "train.bin").read_bytes() == (slow.dir / "train.bin").read_bytes()
    assert np.array_equal(np.asarray(caught.val_tokens()), np.asarray(slow.val_tokens()))
