"""prepare(): documents -> tokenizer -> train.bin / val.bin + meta.json, cached per (source, tokenizer)."""
import contextlib
import errno
import fcntl
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import numpy as np
from tokenizers import Tokenizer

from data.cache import CACHE_VERSION, META_FILE, cache_key, publish, read_meta, write_json
from data.config import DataConfig
from data.errors import DataError
from data.sources import check_config, fingerprint, load_splits
from data.encoding import fast_encoder
from data.token_files import DocumentEncoder, write_split
from data.tokenizer import (batched_texts, check_vocab_size, file_hash, load_tokenizer, max_token_id,
                            read_special_tokens, special_token_ids, train_tokenizer, write_special_tokens)

TOKENIZER_FILE = "tokenizer.json"


@dataclass
class PreparedData:
    dir: Path  # the cache directory of this source + tokenizer
    tokenizer_path: Path  # tokenizer.json inside `dir`; checkpoints carry a copy
    meta: Dict[str, Any]

    def train_tokens(self) -> np.memmap:
        return np.memmap(self.dir / "train.bin", dtype=self.meta["dtype"], mode="r")

    def val_tokens(self) -> np.memmap:
        return np.memmap(self.dir / "val.bin", dtype=self.meta["dtype"], mode="r")

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)


def prepare(cfg: DataConfig, *, seq_len: Optional[int] = None, model_vocab_size: Optional[int] = None,
            log: Callable[[str], None] = print, warn: Optional[Callable[[str], None]] = None) -> PreparedData:
    """Build the token cache for `cfg`, or find it; then check it fits `seq_len` and the model's vocab.

    A second call with the same settings reads only meta.json (it doesn't even import `datasets`), and
    needs no write access. A build takes a lock on data.cache_dir: one builder at a time (ranks, runs).
    `log` gets progress lines (stdout), `warn` what is not progress (stderr); both default to printing
    unless `log` is given, then `warn` follows it (a quiet rank passes a no-op).
    """
    warn = warn or (log if log is not print else (lambda message: print(message, file=sys.stderr)))
    check_config(cfg)
    tokenizer_identity, expected_vocab = _tokenizer_identity(cfg)
    if model_vocab_size is not None:  # fail before an expensive build, not after
        _check_vocab(expected_vocab - 1, model_vocab_size, cfg)
    cache_root = Path(cfg.cache_dir).resolve()
    directory = cache_root / f"{cfg.source}-{cache_key(cache_identity(cfg, tokenizer_identity))}"
    meta = read_meta(directory)  # a hit needs no write access: a shared, read-only cache serves every run
    if meta is None:
        with _build_lock(cache_root, warn):
            meta = read_meta(directory)  # built while this process waited for the lock?
            if meta is None:
                meta = _build(cfg, directory, cache_root, log)
    else:
        log(f"data: using cache {directory}")
        if meta.get("val_rule"):
            log(f"data: validation: {meta['val_rule']}")
    data = PreparedData(dir=directory, tokenizer_path=directory / TOKENIZER_FILE, meta=meta)
    if model_vocab_size is not None:  # the real tokenizer's largest id, now that it exists
        _check_vocab(max_token_id(data.tokenizer()), model_vocab_size, cfg)
    if seq_len is not None:
        for split, count in (("train", meta["train_tokens"]), ("validation", meta["val_tokens"])):
            if count <= seq_len + 1:
                raise DataError(f"the {split} split has {count} tokens, not more than seq_len+1={seq_len + 1}; "
                                "lower trainer.seq_len or add data (data.val_fraction for validation)")
    return data


def cache_identity(cfg: DataConfig, tokenizer_identity: Optional[dict] = None) -> dict:
    """What the token cache's key is made of: every setting that changes what the cache holds — the corpus
    (fingerprint), the tokenizer and the token budgets. Settings that change only where or how fast it is built
    (cache_dir, num_proc), or how training reads it (sampling: the same tokens in another order), stay out, so
    they reuse a cache (tests/test_data_cache.py keeps both lists)."""
    tokenizer_identity = tokenizer_identity if tokenizer_identity is not None else _tokenizer_identity(cfg)[0]
    return {"data": fingerprint(cfg), "tokenizer": tokenizer_identity,
            "budgets": [cfg.token_budget, cfg.val_token_budget]}


def _tokenizer_identity(cfg: DataConfig):
    """(what identifies the tokenizer in the cache key, the vocab size it will have)."""
    if cfg.tokenizer_path is None:
        check_vocab_size(cfg.vocab_size)
        return {"vocab_size": cfg.vocab_size, "train_bytes": cfg.tokenizer_train_bytes}, cfg.vocab_size
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    roles = read_special_tokens(Path(cfg.tokenizer_path).parent)  # an imported tokenizer names its own
    special_token_ids(tokenizer, cfg.tokenizer_path, roles=roles)
    return {"file_hash": file_hash(cfg.tokenizer_path), "roles": roles}, tokenizer.get_vocab_size()


def _check_vocab(max_id: int, model_vocab: int, cfg: DataConfig) -> None:
    """Every token id needs an embedding row: the tokenizer's largest id must be < model.vocab_size.

    A count equality would be too strict: a model may have more rows than the tokenizer has ids
    (ids it never sees, like a padded vocabulary's), and what must fit is the largest id, not the count.
    """
    if max_id < model_vocab:
        return
    if cfg.tokenizer_path is not None:
        raise DataError(f"tokenizer {cfg.tokenizer_path} has token ids up to {max_id} but model.vocab_size={model_vocab}; "
                        f"set data.vocab_size={max_id + 1} (model.vocab_size follows it) or model.vocab_size>={max_id + 1}")
    raise DataError(f"data.vocab_size={cfg.vocab_size} gives token ids up to {max_id} but model.vocab_size={model_vocab}; "
                    f"set model.vocab_size>={max_id + 1} (it follows data.vocab_size unless set)")


@contextlib.contextmanager
def _build_lock(cache_root: Path, warn):
    """One builder per cache folder at a time — the ranks of a torchrun job, concurrent runs: the others
    wait and then find the cache built. Taken on a miss only."""
    try:
        cache_root.mkdir(parents=True, exist_ok=True)
        lock = open(cache_root / ".prepare.lock", "w")
    except OSError as e:
        raise DataError(f"data.cache_dir {cache_root} holds no cache for these settings and cannot be written to "
                        f"({_cause(e)}); point data.cache_dir at a writable directory, or prepare the cache there "
                        "first") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            warn(f"data: waiting for another process preparing data in {cache_root}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # Leave nothing behind. A process that opened this file before the unlink still gets its
            # lock and a newcomer a new one: at worst two builders, whose publish() keeps one cache.
            with contextlib.suppress(OSError):
                os.unlink(cache_root / ".prepare.lock")


WRITE_REFUSED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


def _cause(error: OSError) -> str:
    return os.strerror(error.errno).lower() if error.errno else str(error).splitlines()[0]


def _build(cfg: DataConfig, directory: Path, cache_root: Path, log) -> Dict[str, Any]:
    """_make_cache, with a write the disk refuses (full, quota, file-size limit, read-only) as one line."""
    try:
        return _make_cache(cfg, directory, cache_root, log)
    except OSError as e:
        if e.errno not in WRITE_REFUSED:
            raise
        where = f" while writing {e.filename}" if e.filename else ""
        raise DataError(f"cannot prepare the data in {cache_root}: {_cause(e)}{where}; nothing was kept (a half-built "
                        "cache is deleted); free space there, or point data.cache_dir at another disk") from None


def _make_cache(cfg: DataConfig, directory: Path, cache_root: Path, log) -> Dict[str, Any]:
    start = time.perf_counter()
    log(f"data: preparing {cfg.source} into {directory}")
    with publish(directory) as work:
        # A local corpus's Arrow copy (as big as the corpus) is scratch too: kept, it would stay in the cache
        # forever, one more copy per edit of the files. Hub downloads keep the shared HF cache (load_splits).
        arrow = work / "hf_datasets"
        splits = load_splits(cfg, arrow)
        tokenizer_start = time.perf_counter()
        tokenizer = _make_tokenizer(cfg, splits, work / TOKENIZER_FILE, log)
        tokenizer_seconds = time.perf_counter() - tokenizer_start
        ids = special_token_ids(tokenizer, roles=read_special_tokens(work))
        vocab_size = tokenizer.get_vocab_size()
        dtype = "uint16" if vocab_size < 65536 else "uint32"
        encoder = DocumentEncoder(tokenizer, splits.text_column, ids["eos_id"])
        fast, why_not = fast_encoder(work / TOKENIZER_FILE)
        log("data: encoding with tiktoken (the same ids as tokenizers, checked on each split's first documents)"
            if fast is not None else f"data: encoding with tokenizers: {why_not}")
        scratch = work / "scratch"  # datasets' intermediate Arrow files; never published
        stats = {}
        encode_start = time.perf_counter()
        for name, split, budget in (("train", splits.train, cfg.token_budget), ("val", splits.val, cfg.val_token_budget)):
            stats[name] = write_split(split, encoder, work / f"{name}.bin", dtype, budget, cfg.num_proc, name, scratch,
                                      fast, log)
            if stats[name].documents == 0:
                raise DataError(f"the {name} split of {cfg.path or cfg.source} has no text after dropping empty documents "
                                f"(all {stats[name].dropped:,} are empty or have no '{splits.text_column}' field); "
                                "check data.text_column and the files")
        for never_published in (scratch, arrow):
            shutil.rmtree(never_published, ignore_errors=True)
        meta = {
            "source": cfg.source, "config": asdict(cfg), "cache_version": CACHE_VERSION,
            "tokenizer_hash": file_hash(work / TOKENIZER_FILE), "tokenizer_trained": cfg.tokenizer_path is None,
            "vocab_size": vocab_size, "dtype": dtype, **ids,
            "val_rule": splits.val_rule, "val_files": splits.val_files,
            **{f"{name}_{field}": getattr(s, field) for name, s in stats.items()
               for field in ("tokens", "bytes", "documents", "dropped", "encoder")},
            "prepare_seconds": round(time.perf_counter() - start, 3),
            "tokenizer_seconds": round(tokenizer_seconds, 3),  # training (or copying) the tokenizer
            "encode_seconds": round(time.perf_counter() - encode_start, 3),
        }
        write_json(work / META_FILE, meta)  # last: a directory with meta.json is complete
    log(f"data: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens, "
        f"{meta['train_bytes'] / max(meta['train_tokens'], 1):.2f} bytes/token, {meta['prepare_seconds']:.1f}s")
    dropped = meta["train_dropped"] + meta["val_dropped"]
    if dropped:
        log(f"data: dropped {dropped:,} of {dropped + meta['train_documents'] + meta['val_documents']:,} documents "
            f"with no text (empty, whitespace only, or no '{splits.text_column}' field: data.text_column)")
    log(f"data: validation: {meta['val_rule']}")
    return meta


def _make_tokenizer(cfg: DataConfig, splits, path: Path, log) -> Tokenizer:
    """Copy the configured tokenizer.json, or train one on (the start of) the training split."""
    if cfg.tokenizer_path is not None:
        shutil.copyfile(cfg.tokenizer_path, path)
        # Its roles travel with it: checkpoints copy this file from the cache, and fine-tunes of an
        # imported model keep ending documents with that model's own EOS.
        write_special_tokens(path.parent, read_special_tokens(Path(cfg.tokenizer_path).parent))
        return load_tokenizer(path)
    start = time.perf_counter()
    column = splits.text_column
    batches = (batch[column] for batch in splits.train.select_columns([column]).iter(batch_size=1000))
    tokenizer = train_tokenizer(batched_texts(batches, cfg.tokenizer_train_bytes), cfg.vocab_size)
    tokenizer.save(str(path))
    if tokenizer.get_vocab_size() < cfg.vocab_size:
        log(f"data: the corpus only supports {tokenizer.get_vocab_size()} of data.vocab_size={cfg.vocab_size} tokens")
    log(f"data: trained a {tokenizer.get_vocab_size()}-token byte-level BPE in {time.perf_counter() - start:.1f}s")
    return tokenizer
