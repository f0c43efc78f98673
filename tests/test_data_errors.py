"""Bad input: each problem is one DataError line naming the fix, and no cache is left behind."""

import json
import re

import pytest

from data import DataConfig, DataError, prepare
from scripts import prepare_data
from tests import forked
from tests.data_helpers import QUIET, REPO, cache_entries, make_documents, write_local
from training.program import exit_status


def fails(cfg: DataConfig, match: str, **kwargs) -> str:
    with pytest.raises(DataError, match=match) as error:
        prepare(cfg, **kwargs, **QUIET)
    message = str(error.value)
    assert "\n" not in message and len(message) < 400
    assert cache_entries(cfg.cache_dir) == [], "a failed prepare left something in the cache"
    return message


def local(tmp_path, path, **overrides):
    settings = dict(source="local", path=path, vocab_size=320, cache_dir=str(tmp_path / "cache"))
    return DataConfig(**{**settings, **overrides})


def test_missing_files(tmp_path):
    fails(local(tmp_path, str(tmp_path / "nope" / "*.txt")), r"matches no files.*check the path")
    fails(DataConfig(source="local", cache_dir=str(tmp_path / "cache")), r"data=local needs files.*data.path=")


def test_empty_file(tmp_path, documents):
    write_local(tmp_path / "in", documents, "txt")
    (tmp_path / "in" / "empty.txt").write_text("")
    fails(local(tmp_path, str(tmp_path / "in" / "*.txt")), r"empty.txt' is empty")


def test_missing_text_column(tmp_path, documents):
    path = write_local(tmp_path / "in", documents, "parquet", column="content")
    message = fails(local(tmp_path, path), r"text column 'text' not found")
    assert "content" in message and "data.text_column" in message


def test_text_column_that_is_not_text(tmp_path, documents):
    fails(local(tmp_path, write_local(tmp_path / "in", documents, "parquet"), text_column="id"), r"'id' .* not text")


def test_a_non_text_row_names_its_file_and_line(tmp_path, documents):
    """`"text": 12345` in one row: the column is right, the row is not — said with where it is."""
    path = tmp_path / "rows.jsonl"
    rows = [{"text": d} for d in documents[:20]] + [{"text": 12345}] + [{"text": d} for d in documents[20:40]]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = fails(local(tmp_path, str(path)), "not text")
    assert message.endswith(f': {path} line 21 has {{"text": 12345}}; make it a string or remove that row'), message


def test_a_file_that_is_not_utf8_is_named_in_a_glob(tmp_path, documents):
    """One Latin-1 file among four: the line names that file and the byte, not the glob and an offset."""
    write_local(tmp_path / "in", documents, "txt")
    bad = tmp_path / "in" / "zz_latin1.txt"
    bad.write_bytes("fine text, then a caf\u00e9\n".encode("latin-1"))
    message = fails(local(tmp_path, str(tmp_path / "in" / "*.txt")), "is not UTF-8")
    assert f"{bad} is not UTF-8 (byte 0xe9 at offset 21); convert it" in message, message


def test_no_text_after_cleaning(tmp_path):
    path = tmp_path / "blank.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["", "  ", "\n\n", "\t"] * 10))
    fails(
        local(tmp_path, str(path)),
        r"no text after dropping empty documents \(all \d+ are empty or have no 'text' field\)",
    )


def test_rows_without_the_text_field_are_counted_and_reported(tmp_path, documents):
    """A jsonl row without data.text_column used to vanish silently: the summary counts what was dropped."""
    path = tmp_path / "mixed.jsonl"
    rows = [{"text": d} for d in documents[:60]] + [{"body": "wrong field"}] * 7 + [{"text": "  "}] * 3
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    said = []
    data = prepare(local(tmp_path, str(path)), log=said.append)
    assert data.meta["train_dropped"] + data.meta["val_dropped"] == 10
    assert data.meta["train_documents"] + data.meta["val_documents"] == 60
    assert any(
        line.startswith(
            "data: dropped 10 of 70 documents with no text (empty, whitespace only, or no 'text' "
            "field: data.text_column)"
        )
        for line in said
    ), said


def test_too_few_documents_to_hold_out(tmp_path):
    path = tmp_path / "one.txt"
    path.write_text("a single paragraph")
    fails(local(tmp_path, str(path)), r"1 document\(s\), too few to hold out validation")


def test_one_long_line_and_a_folder_without_text_get_advice_that_applies(tmp_path):
    """A file with no blank line is one paragraph (the default split): the advice names the next finer
    split, not the setting already in use; a folder of images and binaries holds no text at all."""
    line = tmp_path / "line.txt"
    line.write_text("word " * 20000)  # one line, no paragraphs
    fails(
        local(tmp_path, str(line)),
        r"1 document\(s\), too few to hold out validation \(data.sample_by=paragraph\); "
        r"use data.sample_by=line, add documents or files, or give a validation split",
    )
    folder = tmp_path / "binaries"
    folder.mkdir()
    (folder / "cover.png").write_bytes(b"\x89PNG" + bytes(100))
    (folder / "weights.bin").write_bytes(bytes(100))
    fails(
        local(tmp_path, str(folder)),
        r"folder '.*binaries' holds no text data \(cover.png, weights.bin\); "
        r"supported files are .txt",
    )


def test_vocab_too_small_for_the_special_tokens(tmp_path):
    fails(DataConfig(vocab_size=100, cache_dir=str(tmp_path / "cache")), r"vocab_size=100 is too small.*>=259")


def test_seq_len_longer_than_the_validation_split(tmp_path, documents):
    cfg = local(tmp_path, write_local(tmp_path / "in", documents, "jsonl"))
    val_tokens = prepare(cfg, **QUIET).meta["val_tokens"]
    with pytest.raises(DataError, match=rf"validation split has {val_tokens} tokens.*lower trainer.seq_len"):
        prepare(cfg, seq_len=val_tokens, **QUIET)
    prepare(cfg, seq_len=val_tokens - 2, **QUIET)


def test_tokenizer_vocab_disagreeing_with_the_model(tmp_path, documents):
    cfg = local(tmp_path, write_local(tmp_path / "in", documents, "jsonl"))
    fails(cfg, r"data.vocab_size=320 gives token ids up to 319 but model.vocab_size=256", model_vocab_size=256)
    tokenizer = prepare(cfg, **QUIET).tokenizer_path
    given = local(tmp_path, cfg.path, tokenizer_path=str(tokenizer), cache_dir=str(tmp_path / "cache2"))
    fails(
        given,
        rf"tokenizer {tokenizer} has token ids up to 319 but model.vocab_size=300; set data.vocab_size=320",
        model_vocab_size=300,
    )
    assert prepare(given, model_vocab_size=320, **QUIET).meta["vocab_size"] == 320
    assert prepare(given, model_vocab_size=384, **QUIET).meta["vocab_size"] == 320  # spare rows are fine


def test_corpus_too_small_for_the_vocab_is_said_not_fatal(tmp_path):
    cfg = local(tmp_path, write_local(tmp_path / "in", ["ab ab ab", "ba ba"] * 10, "jsonl"), vocab_size=1000)
    messages = []
    meta = prepare(cfg, model_vocab_size=1000, log=messages.append).meta
    assert meta["vocab_size"] < 1000  # the model keeps rows for ids the tokenizer never produces
    assert f"the corpus only supports {meta['vocab_size']} of data.vocab_size=1000 tokens" in "\n".join(messages)


@pytest.mark.parametrize(
    "override, match",
    [
        (dict(source="wikipedia"), "unknown data source 'wikipedia'"),
        (dict(val_fraction=1.5), "val_fraction=1.5"),
        (dict(token_budget=0), "token_budget=0"),
        (dict(sample_by="sentence"), "sample_by='sentence'"),
        (dict(tokenizer_path="/no/such/tokenizer.json"), "does not exist"),
    ],
)
def test_impossible_settings(tmp_path, override, match):
    fails(DataConfig(cache_dir=str(tmp_path / "cache"), **override), match)


def test_unknown_split_names(tmp_path, documents):
    path = write_local(tmp_path / "in", documents, "jsonl")
    fails(local(tmp_path, path, val_split="dev"), r"has no split 'dev' \(splits: train\)")
    fails(local(tmp_path, path, train_split="training"), r"has no split 'training'")


def test_unsupported_and_malformed_files(tmp_path):
    (tmp_path / "data.xml").write_text("<a/>")
    fails(local(tmp_path, str(tmp_path / "data.xml")), r"supported files are")
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{not json\n')
    fails(local(tmp_path, str(tmp_path / "bad.jsonl")), r"cannot read")


def test_prepare_data_script_exits_1_with_one_line(tmp_path):
    missing = tmp_path / "missing.txt"
    proc = forked.run_script(
        REPO / "scripts" / "prepare_data.py",
        "data=local",
        f"data.path={missing}",
        f"data.cache_dir={tmp_path / 'cache'}",
        cwd=tmp_path,
    )
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        f"error: data.path '{missing}' matches no files (relative to {tmp_path}); check the path or glob"
    ]
    assert cache_entries(tmp_path / "cache") == []


def test_prepare_data_script_reports_counts(tmp_path, capsys):
    corpus = write_local(tmp_path / "in", make_documents(200), "jsonl")
    args = ["data=local", f"data.path={corpus}", "data.vocab_size=320", f"data.cache_dir={tmp_path / 'cache'}"]
    assert prepare_data.main(args) == 0
    first = capsys.readouterr().out
    assert re.search(r"train +[\d,]+ tokens +187 documents .* bytes/token", first) and "MB/s" in first  # 13 held
    assert prepare_data.main(args) == 0 and "cache hit" in capsys.readouterr().out
    assert exit_status(prepare_data.main, args + ["trainer.seq_len=100000"]) == 1
    assert "error: the train split has" in capsys.readouterr().err


def test_a_disk_that_fills_while_preparing_is_one_line_and_keeps_nothing(tmp_path):
    """Shakespeare's token files do not fit a 600 KB tmpfs: one DataError line naming the cause and the
    fix, and the small disk holds no half-built cache afterwards."""
    import subprocess
    import sys

    from tests.test_write_errors import mount_namespace
    from tests.train_helpers import REPO

    prefix, disk = mount_namespace(), tmp_path / "small"
    disk.mkdir()
    child = (
        "import os, sys; from data import DataConfig, prepare; from data.sources import DataError\n"
        f"try: prepare(DataConfig(cache_dir={str(disk)!r}), log=lambda m: None)\n"
        "except DataError as e: print('ERROR', e)\n"
        f"print('LEFT', sorted(os.listdir({str(disk)!r})))"
    )
    script = f'mount -t tmpfs -o size=600k tmpfs {disk} && {sys.executable} -c "$0"'
    proc = subprocess.run(prefix + ["sh", "-c", script, child], capture_output=True, text=True, timeout=300, cwd=REPO)
    lines = proc.stdout.splitlines()
    error = next(line for line in lines if line.startswith("ERROR "))
    assert error.startswith(f"ERROR cannot prepare the data in {disk}: no space left on device"), (
        proc.stdout + proc.stderr
    )
    assert error.endswith(
        "; nothing was kept (a half-built cache is deleted); free space there, or point data.cache_dir at another disk"
    )
    assert lines[-1] == "LEFT []", lines[-1]


def test_a_truncated_compressed_file_is_named_in_a_glob(tmp_path, documents):
    """One .txt.gz cut short among three (a download that stopped): the line names that file (issue 68: it named the
    glob only)."""
    import gzip

    (tmp_path / "in").mkdir()
    for i in range(3):
        (tmp_path / "in" / f"{i}.txt.gz").write_bytes(gzip.compress("\n\n".join(documents[i::3]).encode()))
    bad = tmp_path / "in" / "1.txt.gz"
    bad.write_bytes(bad.read_bytes()[:200])
    message = fails(local(tmp_path, str(tmp_path / "in" / "*.txt.gz")), "truncated or corrupt")
    assert f"{bad} is truncated or corrupt (" in message and message.endswith("re-create it or remove it"), message


def test_a_cache_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DataError) as refused:
        prepare(DataConfig(cache_dir=str(tmp_path / "notes.txt")), **QUIET)
    assert str(refused.value) == (
        f"data.cache_dir={tmp_path / 'notes.txt'} is a file, not a folder; point it at a folder (made if missing)"
    )
    assert (tmp_path / "notes.txt").read_text() == "mine"
