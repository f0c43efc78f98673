"""Every source through prepare(): local formats round-trip, hub layouts take the hub path, streams stop at budgets."""

import time
from collections import Counter

import datasets
import numpy as np
import pytest

import data.sources
from data import DataConfig, DataError, prepare
from data.sources import uniform_hash
from tests.data_helpers import QUIET, fineweb_layout, split_documents, tinystories_layout, write_local


def local(tmp_path, path, **overrides):
    return DataConfig(source="local", path=path, vocab_size=320, cache_dir=str(tmp_path / "cache"), **overrides)


def write_books(folder, documents, count):
    """`count` text files of paragraphs; returns {file name: its paragraphs}."""
    folder.mkdir(parents=True, exist_ok=True)
    books = {}
    for i, part in enumerate(np.array_split(np.arange(len(documents)), count)):
        books[f"book{i:02d}.txt"] = [documents[j] for j in part]
        (folder / f"book{i:02d}.txt").write_text("\n\n".join(books[f"book{i:02d}.txt"]), encoding="utf-8")
    return books


@pytest.mark.parametrize("kind", ["txt", "jsonl", "parquet", "csv"])
def test_local_files_round_trip(tmp_path, documents, kind):
    column = "body" if kind in ("jsonl", "parquet") else "text"  # a configurable text column
    prepared = prepare(
        local(tmp_path, write_local(tmp_path / "in", documents, kind, column), text_column=column), **QUIET
    )
    train, val = split_documents(prepared, "train"), split_documents(prepared, "val")
    held = uniform_hash(1234, np.arange(len(documents))) < 0.05  # data.seed's hash of each document's place
    assert 0 < held.sum() < 20  # about 5% of 200 documents held out
    assert val == [d for d, h in zip(documents, held) if h]  # every document, once, intact, in the file's order
    assert train == [d for d, h in zip(documents, held) if not h]
    meta = prepared.meta
    assert meta["train_bytes"] + meta["val_bytes"] == sum(len(d.encode("utf-8")) for d in documents)


def test_a_corpus_read_from_disk_holds_out_the_streams_documents_and_reads_both_splits_in_order(tmp_path, documents):
    path = write_local(tmp_path / "in", documents, "jsonl")
    splits = data.sources.load_splits(local(tmp_path, path), tmp_path / "hf")
    for split in (splits.train, splits.val):  # a sorted selection: a corpus larger than memory is never reread
        assert np.all(np.diff(split._indices.column(0).to_numpy()) > 0)
    whole = prepare(local(tmp_path, path), **QUIET)
    streamed = prepare(local(tmp_path, path, streaming=True), **QUIET)
    assert whole.dir != streamed.dir and split_documents(whole, "val") == split_documents(streamed, "val")
    assert np.array_equal(whole.train_tokens(), streamed.train_tokens())  # the same documents, the same order


def test_the_tokenizers_sample_of_a_big_corpus_is_spread_over_it_and_read_in_order(tmp_path, documents, monkeypatch):
    """A corpus larger than data.tokenizer_train_bytes trains the tokenizer on documents from all of it, in the file's
    order — not its head alone, which could be one topic."""
    import data.cache

    seen, real = [], data.cache.train_tokenizer

    def recording(batches, vocab_size):
        texts = [t for batch in batches for t in batch]
        seen.extend(texts)
        return real([texts], vocab_size)

    monkeypatch.setattr(data.cache, "train_tokenizer", recording)
    path = write_local(tmp_path / "in", documents, "jsonl")
    total = sum(len(d.encode("utf-8")) for d in documents)
    prepare(local(tmp_path, path, tokenizer_train_bytes=total // 4), **QUIET)
    where = [documents.index(t) for t in seen]
    assert where == sorted(where) and len(seen) < len(documents) // 2  # a sample, read in order
    assert max(where) > 0.8 * len(documents)  # reaching the corpus's end


def test_globs_and_save_to_disk_give_the_same_tokens(tmp_path, documents):
    books = write_books(tmp_path / "texts", documents, 4)
    from_glob = prepare(local(tmp_path, str(tmp_path / "texts" / "*.txt")), **QUIET)
    held = from_glob.meta["val_files"]
    assert len(held) == 1  # 4 files: one is held out whole, however small val_fraction is
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(
                {"text": [d for name in books if name not in held for d in books[name]]}
            ),
            "validation": datasets.Dataset.from_dict({"text": books[held[0]]}),
        }
    ).save_to_disk(str(tmp_path / "saved"))
    from_disk = prepare(local(tmp_path, str(tmp_path / "saved")), **QUIET)
    assert from_glob.dir != from_disk.dir
    assert Counter(split_documents(from_glob, "train") + split_documents(from_glob, "val")) == Counter(documents)
    assert np.array_equal(from_glob.train_tokens(), from_disk.train_tokens())  # same documents, same order
    assert np.array_equal(from_glob.val_tokens(), from_disk.val_tokens())


def test_text_files_sample_by_document(tmp_path, documents):
    folder = tmp_path / "books"
    folder.mkdir()
    for i in range(20):
        (folder / f"book{i}.txt").write_text("\n\n".join(documents[i * 10 : (i + 1) * 10]), encoding="utf-8")
    prepared = prepare(local(tmp_path, str(folder / "*.txt"), sample_by="document"), **QUIET)
    assert (prepared.meta["train_documents"], prepared.meta["val_documents"]) == (19, 1)


@pytest.mark.parametrize("as_folder", [False, True])
def test_several_text_files_hold_out_whole_files(tmp_path, documents, as_folder):
    books = write_books(tmp_path / "books", documents, 10)
    messages = []
    path = str(tmp_path / "books") if as_folder else str(tmp_path / "books" / "*.txt")
    prepared = prepare(local(tmp_path, path, val_fraction=0.2), log=messages.append)
    held = prepared.meta["val_files"]
    assert held and len(held) < len(books)
    train, val = split_documents(prepared, "train"), split_documents(prepared, "val")
    # Every paragraph of a held-out file is in validation; none of any other file is.
    assert Counter(val) == Counter(d for name in held for d in books[name])
    assert Counter(train) == Counter(d for name in books if name not in held for d in books[name])
    held_bytes = sum((tmp_path / "books" / name).stat().st_size for name in held)
    all_bytes = sum(f.stat().st_size for f in (tmp_path / "books").iterdir())
    assert abs(held_bytes / all_bytes - 0.2) < 0.06  # 10 similar files: within about half a file
    assert prepared.meta["val_bytes"] == sum(len(d.encode("utf-8")) for d in val)  # bpb denominator
    note = next(m for m in messages if m.startswith("data: validation: "))
    assert f"{len(held)} of 10 files held out whole" in note and all(name in note for name in held)
    again = []
    prepare(local(tmp_path, path, val_fraction=0.2), log=again.append)  # a cache hit says it too
    assert note in again


def test_one_text_file_holds_out_paragraphs_and_says_so(tmp_path, documents):
    messages = []
    prepared = prepare(local(tmp_path, write_local(tmp_path / "in", documents, "txt")), log=messages.append)
    held = int((uniform_hash(1234, np.arange(200)) < 0.05).sum())
    assert prepared.meta["val_files"] is None and prepared.meta["val_documents"] == held
    note = next(m for m in messages if m.startswith("data: validation: "))
    assert f"{held} of 200 documents" in note and "one text file corpus.txt" in note and "sample_by=paragraph" in note
    assert "read in order" in note


def expected_documents(text: str, sample_by: str) -> list:
    """What datasets' text builder makes of a file, minus the empty documents the encoder drops."""
    pieces = {"paragraph": text.split("\n\n"), "line": text.splitlines(), "document": [text]}[sample_by]
    return [p for p in pieces if p and not p.isspace()]


@pytest.mark.parametrize("sample_by", ["paragraph", "line", "document"])
def test_text_folder_laid_out_like_the_hub_honours_sample_by(tmp_path, documents, sample_by):
    root = tmp_path / "hub_like"
    root.mkdir()
    # Paragraphs of two lines, so paragraph and line give different documents (and byte counts).
    train_text = "\n\n".join(f"{a}\n{b}" for a, b in zip(documents[:80:2], documents[1:80:2]))
    val_text = "\n\n".join(f"{a}\n{b}" for a, b in zip(documents[80:100:2], documents[81:100:2]))
    (root / "train.txt").write_text(train_text, encoding="utf-8")
    (root / "validation.txt").write_text(val_text, encoding="utf-8")
    prepared = prepare(local(tmp_path, str(root), sample_by=sample_by), **QUIET)
    for split, text in (("train", train_text), ("val", val_text)):
        expected = expected_documents(text, sample_by)
        assert split_documents(prepared, split) == expected
        assert prepared.meta[f"{split}_bytes"] == sum(len(d.encode("utf-8")) for d in expected)
    assert prepared.meta["val_rule"] == f"the 'validation' split of {root}"


def test_own_validation_split_is_used(tmp_path, documents):
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({"text": documents[:150]}),
            "validation": datasets.Dataset.from_dict({"text": documents[150:]}),
        }
    ).save_to_disk(str(tmp_path / "saved"))
    prepared = prepare(local(tmp_path, str(tmp_path / "saved")), **QUIET)
    assert split_documents(prepared, "val") == documents[150:]


def test_hub_layout_goes_through_the_hub_loader(tmp_path, documents, monkeypatch):
    calls = []
    real = data.sources.load_hub_dataset
    monkeypatch.setattr(data.sources, "load_hub_dataset", lambda *a, **k: calls.append(a) or real(*a, **k))
    path = tinystories_layout(tmp_path / "TinyStories", documents[:180], documents[180:])
    cfg = DataConfig(
        source="tinystories", path=path, val_split="validation", vocab_size=320, cache_dir=str(tmp_path / "cache")
    )
    prepared = prepare(cfg, **QUIET)
    assert calls and calls[0][0] == path
    assert split_documents(prepared, "train") == documents[:180]
    assert split_documents(prepared, "val") == documents[180:]


def test_any_hub_dataset_is_source_hub_with_its_id(tmp_path, documents, monkeypatch):
    """A new hub corpus needs no code and no borrowed name: source=hub, path=its id (here a local folder in
    the hub's layout), the same loader as the named ones; without a path, one line saying so."""
    calls = []
    real = data.sources.load_hub_dataset
    monkeypatch.setattr(data.sources, "load_hub_dataset", lambda *a, **k: calls.append(a) or real(*a, **k))
    path = tinystories_layout(tmp_path / "SomeStories", documents[:180], documents[180:])
    prepared = prepare(
        DataConfig(source="hub", path=path, val_split="validation", vocab_size=320, cache_dir=str(tmp_path / "cache")),
        **QUIET,
    )
    assert calls and calls[0][0] == path and prepared.meta["source"] == "hub"
    assert split_documents(prepared, "val") == documents[180:]
    with pytest.raises(DataError, match=r"^data=hub needs the dataset: set data.path=<hub id>"):
        prepare(DataConfig(source="hub", cache_dir=str(tmp_path / "cache")), **QUIET)


def fineweb(tmp_path, path, **overrides):
    settings = dict(
        source="fineweb_edu",
        path=path,
        name="sample-10BT",
        streaming=True,
        token_budget=3000,
        val_token_budget=600,
        val_fraction=0.1,
        vocab_size=320,
        cache_dir=str(tmp_path / "cache"),
    )
    return DataConfig(**{**settings, **overrides})


def test_streaming_stops_at_the_token_budget(tmp_path, documents):
    path = fineweb_layout(tmp_path / "fineweb-edu", documents)
    prepared = prepare(fineweb(tmp_path, path), **QUIET)
    longest = max(len(prepared.tokenizer().encode(d).ids) + 1 for d in documents)
    meta = prepared.meta
    assert 3000 <= meta["train_tokens"] < 3000 + longest  # whole documents: stops after the one crossing it
    assert 600 <= meta["val_tokens"] < 600 + longest
    train, val = split_documents(prepared, "train"), split_documents(prepared, "val")
    assert set(train) <= set(documents) and set(val) <= set(documents) and not set(train) & set(val)
    assert train == [d for d in documents if d in set(train)]  # stream order is kept
    assert meta["train_bytes"] == sum(len(d.encode("utf-8")) for d in train)


def test_streaming_is_deterministic_and_matches_the_hash(tmp_path, documents):
    path = fineweb_layout(tmp_path / "fineweb-edu", documents)
    first = prepare(fineweb(tmp_path, path, token_budget=None, val_token_budget=None), **QUIET)
    second = prepare(
        fineweb(tmp_path, path, token_budget=None, val_token_budget=None, cache_dir=str(tmp_path / "other")), **QUIET
    )
    assert np.array_equal(first.val_tokens(), second.val_tokens())
    held_out = uniform_hash(1234, np.arange(len(documents))) < 0.1
    assert split_documents(first, "val") == [d for d, v in zip(documents, held_out) if v]
    assert split_documents(first, "train") == [d for d, v in zip(documents, held_out) if not v]


def unreachable(*args, **kwargs):
    raise OSError("network is unreachable")  # what the 2 s probe of the hub meets offline


def test_unreachable_hub_fails_fast_naming_offline_choices(tmp_path, monkeypatch):
    monkeypatch.setattr(data.sources.socket, "create_connection", unreachable)
    cfg = DataConfig(source="tinystories", path="minillama-tests/no-such-dataset", cache_dir=str(tmp_path / "cache"))
    start = time.perf_counter()
    with pytest.raises(DataError, match=r"cannot reach the Hugging Face hub.*data=shakespeare.*data=local") as error:
        prepare(cfg, **QUIET)
    assert time.perf_counter() - start < 10 and "\n" not in str(error.value)
    assert not any((tmp_path / "cache").glob("tinystories-*"))


def test_offline_flag_is_restored_after_a_failed_hub_call(tmp_path, monkeypatch):
    before = datasets.config.HF_HUB_OFFLINE
    monkeypatch.setattr(data.sources.socket, "create_connection", unreachable)
    with pytest.raises(DataError):
        data.sources.load_hub_dataset("minillama-tests/no-such-dataset")
    assert datasets.config.HF_HUB_OFFLINE == before
