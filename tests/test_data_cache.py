"""The token cache: a second run is instant, any change that alters the tokens misses, a crash leaves nothing valid."""

import contextlib
import dataclasses
import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import data.cache
from data import DataConfig, prepare
from data.cache import damage, publish, read_meta, sweep_dead_builds
from data.sources import DataError
from tests import forked
from tests.data_helpers import QUIET, REPO, cache_entries, make_documents, write_local


@pytest.fixture
def corpus(tmp_path, documents):
    return write_local(tmp_path / "in", documents, "jsonl")


def config(tmp_path, path, **overrides):
    return DataConfig(
        **{**dict(source="local", path=path, vocab_size=320, cache_dir=str(tmp_path / "cache")), **overrides}
    )


def test_second_run_is_a_cache_hit(tmp_path, corpus, monkeypatch):
    first = prepare(config(tmp_path, corpus), **QUIET)
    stamp = os.stat(first.dir / "train.bin").st_mtime_ns
    monkeypatch.setattr(data.cache, "_build", lambda *a, **k: pytest.fail("rebuilt a cached corpus"))
    messages = []
    second = prepare(config(tmp_path, corpus, sampling="random"), log=messages.append)  # sampling doesn't change tokens
    assert second.dir == first.dir and second.meta == first.meta
    assert os.stat(second.dir / "train.bin").st_mtime_ns == stamp and "using cache" in messages[0]
    assert sorted(p.name for p in first.dir.iterdir()) == ["meta.json", "tokenizer.json", "train.bin", "val.bin"]


def test_a_local_corpus_leaves_no_arrow_copy_in_the_cache(tmp_path, corpus):
    """datasets converts local files to Arrow (a copy as big as the corpus); it is scratch of the build, so the
    cache folder holds only token directories however often the files change."""
    first = prepare(config(tmp_path, corpus), **QUIET)
    Path(corpus).write_text(Path(corpus).read_text() + '{"text": "one more document"}\n')
    second = prepare(config(tmp_path, corpus), **QUIET)
    assert first.dir != second.dir
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name != ".prepare.lock") == sorted(
        [first.dir.name, second.dir.name]
    )


def test_a_waiter_reads_the_cache_built_while_it_waited(tmp_path, corpus, monkeypatch):
    """A miss takes the build lock; whoever held it may have built this very cache meanwhile (the other rank of
    a torchrun job, a run started beside this one). The waiter must find it and build nothing. Here the other
    builder runs, start to end, at the moment this process asks for the lock — every time, not only when a real
    race goes that way: dropping the re-check under the lock passed the whole suite in 2 runs of 5."""
    real_build, real_lock, builds, others = data.cache._build, data.cache._build_lock, [], []
    monkeypatch.setattr(data.cache, "_build", lambda *a, **k: builds.append(1) or real_build(*a, **k))

    @contextlib.contextmanager
    def lock_after_another_builder(cache_root, warn):
        monkeypatch.setattr(data.cache, "_build_lock", real_lock)  # the other builder's own, plain lock
        others.append(prepare(config(tmp_path, corpus), **QUIET))
        assert builds == [1]  # it missed and built
        with real_lock(cache_root, warn):
            yield

    monkeypatch.setattr(data.cache, "_build_lock", lock_after_another_builder)
    mine, (other,) = prepare(config(tmp_path, corpus), **QUIET), others
    assert builds == [1] and mine.dir == other.dir and mine.meta == other.meta  # nothing built twice
    assert cache_entries(tmp_path / "cache") == [other.dir.name]


@pytest.mark.parametrize(
    "change",
    [dict(vocab_size=300), dict(val_fraction=0.1), dict(seed=1), dict(text_column="id2"), dict(token_budget=1000)],
)
def test_changed_settings_miss_the_cache(tmp_path, corpus, change):
    base = prepare(config(tmp_path, corpus), **QUIET)
    if "text_column" in change:  # same documents under another column name
        corpus = write_local(tmp_path / "other", make_documents(200), "jsonl", column="id2")
    changed = prepare(config(tmp_path, corpus, **change), **QUIET)
    assert changed.dir != base.dir and read_meta(base.dir) is not None


def test_sample_by_keys_text_caches_only(tmp_path, corpus, documents):
    folder = tmp_path / "texts"
    folder.mkdir()
    (folder / "train.txt").write_text("\n\n".join(documents[:150]), encoding="utf-8")
    (folder / "validation.txt").write_text("\n\n".join(documents[150:]), encoding="utf-8")
    by_paragraph = prepare(config(tmp_path, str(folder)), **QUIET)
    by_line = prepare(config(tmp_path, str(folder), sample_by="line"), **QUIET)
    assert by_line.dir != by_paragraph.dir  # a text folder honours sample_by, so it keys the cache
    jsonl = prepare(config(tmp_path, corpus), **QUIET)
    assert prepare(config(tmp_path, corpus, sample_by="line"), **QUIET).dir == jsonl.dir  # no meaning for JSON


def test_edited_file_invalidates_the_cache(tmp_path, documents):
    path = write_local(tmp_path / "in", documents, "txt")
    before = prepare(config(tmp_path, path), **QUIET)
    write_local(tmp_path / "in", documents[:-1] + ["A new last paragraph."], "txt")
    after = prepare(config(tmp_path, path), **QUIET)
    assert after.dir != before.dir
    assert after.meta["train_bytes"] + after.meta["val_bytes"] != before.meta["train_bytes"] + before.meta["val_bytes"]


def test_given_tokenizer_reproduces_the_trained_one(tmp_path, corpus):
    trained = prepare(config(tmp_path, corpus), **QUIET)
    given = prepare(config(tmp_path, corpus, tokenizer_path=str(trained.tokenizer_path)), **QUIET)
    assert given.dir != trained.dir and not given.meta["tokenizer_trained"]
    assert given.meta["tokenizer_hash"] == trained.meta["tokenizer_hash"]
    assert np.array_equal(given.train_tokens(), trained.train_tokens())
    # A different tokenizer.json (same vocab size) is a different cache.
    other = tmp_path / "other.json"
    prepare(config(tmp_path, corpus, seed=9), **QUIET).tokenizer().save(str(other))
    assert prepare(config(tmp_path, corpus, tokenizer_path=str(other)), **QUIET).dir != given.dir


def test_failure_mid_write_leaves_no_cache(tmp_path, corpus, monkeypatch):
    def crash(dataset, column, tokenizer, eos_id, out, *args, **kwargs):
        out.write_bytes(b"\0" * 100)  # half a token file
        raise RuntimeError("disk full")

    monkeypatch.setattr(data.cache, "write_split", crash)
    with pytest.raises(RuntimeError, match="disk full"):
        prepare(config(tmp_path, corpus), **QUIET)
    assert cache_entries(tmp_path / "cache") == []
    monkeypatch.undo()
    assert prepare(config(tmp_path, corpus), **QUIET).meta["train_tokens"] > 0


def test_killed_process_leaves_nothing_that_looks_valid(tmp_path, corpus):
    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        import data.cache
        from data import DataConfig, prepare
        def killed(dataset, column, tokenizer, eos_id, out, *args, **kwargs):
            out.write_bytes(b"\\0" * 100)
            (out.parent / "meta.json").write_text("{{}}")  # even a stray meta.json in the temp dir
            os.kill(os.getpid(), signal.SIGKILL)
        data.cache.write_split = killed
        prepare(DataConfig(source="local", path={corpus!r}, vocab_size=320, cache_dir={str(tmp_path / "cache")!r}))
    """)
    (tmp_path / "killed.py").write_text(script)
    proc = forked.run([str(tmp_path / "killed.py")], dict(os.environ), REPO, timeout=120)  # a real process, forked
    assert proc.returncode == -9
    leftovers = cache_entries(tmp_path / "cache")
    assert len(leftovers) == 1 and ".tmp-" in leftovers[0]  # only a temp name, never a cache name
    prepared = prepare(config(tmp_path, corpus), **QUIET)
    assert cache_entries(tmp_path / "cache") == [prepared.dir.name]  # the dead process's temp dir is swept


# A builder in another process: data/cache.py's publish(), the process started from the repository.
BUILDER = """
import importlib.util, json, os, sys
sys.path.insert(0, {repo!r})
spec = importlib.util.spec_from_file_location("cache", {cache_py!r})
cache = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cache)
with cache.publish(cache.Path({final!r})) as work:
    (work / "train.bin").write_bytes(b"tokens of the slow builder")
    print(work.name, flush=True)
    sys.stdin.readline()  # the test lets it finish once the other builder has published
    (work / "meta.json").write_text(json.dumps({{"who": "slow", "pid": os.getpid()}}))
print("published or lost the race", flush=True)
"""


def test_a_builder_never_sweeps_the_temp_dir_of_a_live_one(tmp_path):
    """Two real processes build the same key: the fast one (this test) sweeps, starts, publishes and
    wins while the slow one is still writing; the slow one's temp dir survives all that, it finishes,
    loses the rename race cleanly (exit 0) and leaves nothing behind. The sweep removes only the temp
    dirs of processes that no longer run."""
    final = tmp_path / "local-abc"
    script = BUILDER.format(repo=str(REPO), cache_py=str(REPO / "data" / "cache.py"), final=str(final))
    slow = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        slow_temp = tmp_path / slow.stdout.readline().strip()
        assert slow_temp.name == f"local-abc.tmp-{slow.pid}" and slow_temp.is_dir()
        dead_temp = tmp_path / "local-abc.tmp-999999999"  # a builder that was killed: its pid is gone
        other_key = tmp_path / "local-def.tmp-999999999"  # a dead build of other settings: swept just the same
        dead_temp.mkdir()
        other_key.mkdir()
        sweep_dead_builds(tmp_path)  # what taking the build lock does
        assert slow_temp.is_dir() and not dead_temp.exists() and not other_key.exists()
        with publish(final) as work:
            (work / "meta.json").write_text('{"who": "fast"}')
        out, err = slow.communicate("go\n", timeout=60)
    finally:
        slow.kill()
    assert slow.returncode == 0, err
    assert out.strip().endswith("published or lost the race")
    assert read_meta(final) == {"who": "fast"} and cache_entries(tmp_path) == ["local-abc"]


def test_concurrent_builders_keep_the_first_copy(tmp_path):
    final = tmp_path / "local-abc"
    with publish(final) as work:
        (work / "meta.json").write_text('{"who": "first"}')
    with publish(final) as work:  # another rank finishing the same key later
        (work / "meta.json").write_text('{"who": "second"}')
    assert read_meta(final) == {"who": "first"} and cache_entries(tmp_path) == ["local-abc"]


# Every DataConfig field, by what it does to the cache: a content field changes the tokens, so a change of it must
# change the key (a cache built with another value would be served as this one); the others only say where or how
# fast the cache is built. A new field fails test_every_data_field_is_classified until it is put in one of the two.
CONTENT_CHANGES = {  # field → another value, on a local text corpus (hub-only fields: on a hub source below)
    "source": "hub",
    "path": "other.txt",
    "text_column": "body",
    "sample_by": "document",
    "train_split": "train2",
    "val_split": "valid",
    "val_fraction": 0.1,
    "streaming": True,
    "token_budget": 1000,
    "val_token_budget": 500,
    "vocab_size": 300,
    "tokenizer_train_bytes": 10_000,
    "seed": 1,
}
HUB_ONLY_CHANGES = {"name": "sample-10BT", "data_files": ["train-*.parquet"]}
TOKENIZER_FILE_FIELD = "tokenizer_path"  # keyed by the file's hash (test_given_tokenizer_reproduces_the_trained_one)
NOT_CONTENT = {
    "cache_dir": "where the cache lives",
    "sampling": "how training draws windows from the tokens, not which tokens there are",
}


def test_every_data_field_is_classified():
    fields = {f.name for f in dataclasses.fields(DataConfig)}
    assert fields == set(CONTENT_CHANGES) | set(HUB_ONLY_CHANGES) | {TOKENIZER_FILE_FIELD} | set(NOT_CONTENT)


@pytest.mark.parametrize("field", sorted(CONTENT_CHANGES))
def test_each_content_setting_is_in_the_cache_key(tmp_path, field):
    """Dropping any of them from the key (val_token_budget once went unnoticed by every test) fails here."""
    for name in ("plays.txt", "other.txt"):
        (tmp_path / name).write_text("To be, or not to be.\n\nThat is the question.\n")
    base = DataConfig(source="local", path=str(tmp_path / "plays.txt"), vocab_size=320)
    changed = dataclasses_replace(base, field, CONTENT_CHANGES[field], tmp_path)
    assert data.cache.cache_identity(changed) != data.cache.cache_identity(base)


@pytest.mark.parametrize("field", sorted(HUB_ONLY_CHANGES))
def test_each_hub_setting_is_in_the_cache_key(field):
    base = DataConfig(source="hub", path="roneneldan/TinyStories", vocab_size=320)
    changed = dataclasses_replace(base, field, HUB_ONLY_CHANGES[field])
    assert data.cache.cache_identity(changed) != data.cache.cache_identity(base)


@pytest.mark.parametrize("field", sorted(NOT_CONTENT))
def test_where_how_fast_and_in_what_order_do_not_change_the_key(tmp_path, field):
    (tmp_path / "plays.txt").write_text("To be, or not to be.\n")
    base = DataConfig(source="local", path=str(tmp_path / "plays.txt"), vocab_size=320)
    changed = dataclasses_replace(base, field, {"cache_dir": str(tmp_path / "elsewhere"), "sampling": "random"}[field])
    assert data.cache.cache_identity(changed) == data.cache.cache_identity(base)


def dataclasses_replace(cfg: DataConfig, field: str, value, tmp_path=None) -> DataConfig:
    if field == "path" and tmp_path is not None:
        value = str(tmp_path / value)
    if field == "source":  # a hub source needs its id
        return dataclasses.replace(cfg, source=value, path="roneneldan/TinyStories")
    return dataclasses.replace(cfg, **{field: value})


# ---- a cache verified on every use (docs/reliability.md) -------------------------------------------------------


def _truncate(directory):
    path = directory / "train.bin"
    path.write_bytes(path.read_bytes()[: path.stat().st_size * 47 // 100 // 2 * 2])


def _past_the_vocabulary(directory):
    path = directory / "train.bin"
    tokens = np.fromfile(path, dtype=read_meta(directory)["dtype"])
    tokens[5] = 4000  # the tokenizer has 320 ids
    tokens.tofile(path)


def _flipped(directory):
    path = directory / "val.bin"
    raw = bytearray(path.read_bytes())
    raw[0] ^= 1
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize(
    "damage, said",
    [
        (_truncate, "train.bin holds"),
        (_past_the_vocabulary, "train.bin does not match its SHA-256 in meta.json"),
        (_flipped, "val.bin does not match its SHA-256"),
        (lambda d: (d / "val.bin").unlink(), "val.bin is missing"),
        (lambda d: (d / "tokenizer.json").write_text("{}"), "tokenizer.json is missing or not the one"),
    ],
)
def test_a_damaged_cache_is_refused_in_one_line_naming_it_and_the_fix(tmp_path, corpus, damage, said):
    built = prepare(config(tmp_path, corpus), **QUIET)
    damage(built.dir)
    with pytest.raises(DataError) as raised:
        prepare(config(tmp_path, corpus), **QUIET)
    message = str(raised.value)
    assert said in message and str(built.dir) in message and "delete that folder" in message and "\n" not in message


def test_meta_records_each_splits_checksum_and_largest_id(tmp_path, corpus):
    built = prepare(config(tmp_path, corpus), **QUIET)
    for split in ("train", "val"):
        tokens = np.fromfile(built.dir / f"{split}.bin", dtype=built.meta["dtype"])
        assert built.meta[f"{split}_max_id"] == int(tokens.max()) < built.meta["vocab_size"]
        assert built.meta[f"{split}_sha256"] == hashlib.sha256(tokens.tobytes()).hexdigest()


def test_an_id_past_the_vocabulary_is_named_even_where_the_checksum_agrees(tmp_path, corpus):
    """A cache whose meta.json was written with the bad id (a bug of ours, or a tool's): the largest id decides."""
    built = prepare(config(tmp_path, corpus), **QUIET)
    meta = {**built.meta, "train_max_id": built.meta["vocab_size"]}
    assert damage(built.dir, meta) == f"train.bin holds token id {meta['vocab_size']}, past the vocabulary of 320"


def test_a_cache_folder_without_its_meta_is_rebuilt_every_time_it_is_met(tmp_path, corpus):
    """A folder without meta.json is never a cache anyone can open (publish renames complete folders only): it is
    rebuilt in place, once, and the next start is a hit — not a traceback on every start."""
    built = prepare(config(tmp_path, corpus), **QUIET)
    expected = built.meta
    (built.dir / "meta.json").unlink()
    again = prepare(config(tmp_path, corpus), **QUIET)
    assert again.dir == built.dir and {k: v for k, v in again.meta.items() if not k.endswith("seconds")} == {
        k: v for k, v in expected.items() if not k.endswith("seconds")
    }
    messages = []
    prepare(config(tmp_path, corpus), log=messages.append)
    assert "using cache" in messages[0]


def test_an_older_cache_without_checksums_is_named_as_such(tmp_path, corpus):
    built = prepare(config(tmp_path, corpus), **QUIET)
    assert "cache version 2, without the checksums" in damage(built.dir, {**built.meta, "cache_version": 2})


def test_a_cache_hit_sweeps_the_scratch_of_dead_builds_of_any_settings(tmp_path, corpus):
    """A `.tmp-<pid>` of a build that was killed (200 MB in the issue's case) goes at the next start, hit or not."""
    built = prepare(config(tmp_path, corpus), **QUIET)
    dead = tmp_path / "cache" / "local-0123456789ab.tmp-999999999"
    dead.mkdir()
    (dead / "train.bin").write_bytes(bytes(1000))
    prepare(config(tmp_path, corpus), **QUIET)
    assert cache_entries(tmp_path / "cache") == [built.dir.name]


PREPARE_SLOWLY = """
import sys, time
sys.path[:0] = [{repo!r}, {repo!r} + "/scripts"]
import data.cache
real = data.cache.write_split
def slow(*args, **kwargs):
    stats = real(*args, **kwargs)
    print("written", flush=True)
    time.sleep(60)
    return stats
data.cache.write_split = slow
args = ["data=local", "data.path={corpus}", "data.vocab_size=320", "data.cache_dir={cache}"]
if {program!r} == "train.py":
    import os, runpy
    os.chdir({tmp!r})
    sys.argv = ["train.py", *args, "debug=tiny", "hydra.run.dir={tmp}/run"]
    runpy.run_path({repo!r} + "/train.py", run_name="__main__")
else:
    from training.program import run
    from scripts.prepare_data import main
    sys.argv = ["prepare_data.py", *args]
    run(main)
"""


@pytest.mark.parametrize(
    "program, said",
    [
        ("prepare_data.py", "SIGTERM: interrupted"),
        ("train.py", "SIGTERM: interrupted before training started; nothing was saved"),
    ],
)
def test_sigterm_during_preparation_is_one_line_143_and_leaves_no_scratch(tmp_path, corpus, program, said):
    """As Ctrl-C: the build's `finally` removes its scratch, then one line and 143 (before: no line, 143, and the
    half-built `<key>.tmp-<pid>` left behind)."""
    script = PREPARE_SLOWLY.format(
        repo=str(REPO), corpus=corpus, cache=tmp_path / "cache", program=program, tmp=str(tmp_path)
    )
    (tmp_path / "prepare_slowly.py").write_text(script)
    # A real process forked from the preloaded server (tests/forked.py): no ~4 s interpreter and torch start.
    proc = forked.ForkedRun([str(tmp_path / "prepare_slowly.py")], dict(os.environ), REPO)
    try:
        while "written" not in proc.stdout.read():
            assert proc.poll() is None, proc.stderr.read()
            time.sleep(0.05)
        assert any(".tmp-" in name for name in cache_entries(tmp_path / "cache"))
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 143 and err.strip().splitlines()[-1] == said, err
    assert "Traceback" not in err
    assert cache_entries(tmp_path / "cache") == []
