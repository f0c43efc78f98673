"""The token cache: prepare() turns documents into train.bin / val.bin (one flat file of ids each, EOS after every
document) and meta.json, in a directory per (corpus, tokenizer) key, published by one atomic rename. Encoding reads
a window of text at a time, on tiktoken where it gives `tokenizers`' ids (~5-10× faster: fast_encoder)."""

import contextlib
import errno
import fcntl
import functools
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np
from tokenizers import Tokenizer
from tqdm.auto import tqdm

from data.sources import DataConfig, DataError, check_config, fingerprint, hashed_choice, load_splits
from data.tokenizer import (
    batched_texts,
    check_vocab_size,
    file_hash,
    load_tokenizer,
    max_token_id,
    read_special_tokens,
    special_token_ids,
    train_tokenizer,
    write_special_tokens,
)

# Up when the cleaning, the tokenization, the split rule or the layout changes: old caches then miss (history: git).
CACHE_VERSION = 4
META_FILE, TOKENIZER_FILE = "meta.json", "tokenizer.json"
BATCH_SIZE, ENCODE_BYTES = 1000, 4 * 1024 * 1024  # documents read at a time; text per window in flight (memory)
CHECK_BYTES = 256 * 1024  # tiktoken's ids are compared with `tokenizers`' on this much of each split
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""  # ByteLevel's regex
WRITE_REFUSED = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM)


@dataclass
class PreparedData:
    dir: Path  # the cache directory of this corpus + tokenizer
    tokenizer_path: Path  # tokenizer.json inside `dir`; checkpoints carry a copy
    meta: Dict[str, Any]

    def train_tokens(self) -> np.memmap:
        return np.memmap(self.dir / "train.bin", dtype=self.meta["dtype"], mode="r")

    def val_tokens(self) -> np.memmap:
        return np.memmap(self.dir / "val.bin", dtype=self.meta["dtype"], mode="r")

    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)


def read_meta(directory: Path) -> Optional[Dict[str, Any]]:
    """The meta.json of a complete cache, or None: a directory only ever exists complete (publish)."""
    try:
        return json.loads((Path(directory) / META_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def damage(directory: Path, meta: Dict[str, Any]) -> Optional[str]:
    """What is wrong with a cache's files against its meta.json, or None: each split's size and SHA-256 (one read,
    ~1 s per GB), its largest id below the vocabulary, the tokenizer's hash — as a checkpoint's manifest is checked."""
    if meta.get("cache_version") != CACHE_VERSION:
        return f"it is cache version {meta.get('cache_version')}, without the checksums of version {CACHE_VERSION}"
    itemsize = np.dtype(meta["dtype"]).itemsize
    for split in ("train", "val"):
        path, size = Path(directory) / f"{split}.bin", meta[f"{split}_tokens"] * itemsize
        if not path.is_file():
            return f"{path.name} is missing"
        if path.stat().st_size != size:
            return f"{path.name} holds {path.stat().st_size:,} bytes, not the {size:,} meta.json records"
        with open(path, "rb") as f:  # streamed: a split larger than memory is hashed in chunks
            digest = hashlib.file_digest(f, "sha256").hexdigest()
        if digest != meta[f"{split}_sha256"]:
            return f"{path.name} does not match its SHA-256 in meta.json"
        if meta[f"{split}_max_id"] >= meta["vocab_size"]:
            return f"{path.name} holds token id {meta[f'{split}_max_id']}, past the vocabulary of {meta['vocab_size']}"
    tokenizer = Path(directory) / TOKENIZER_FILE
    if not tokenizer.is_file() or file_hash(tokenizer) != meta["tokenizer_hash"]:
        return f"{TOKENIZER_FILE} is missing or not the one the tokens were encoded with"
    return None


def open_intact(directory: Path) -> Optional[PreparedData]:
    """The cache in `directory` if it is there and intact, else None: a resume whose corpus moved trains on it."""
    meta = read_meta(directory)
    if meta is None or damage(directory, meta) is not None:
        return None
    return PreparedData(dir=Path(directory), tokenizer_path=Path(directory) / TOKENIZER_FILE, meta=meta)


def open_cache(directory: Path, meta: Dict[str, Any]) -> PreparedData:
    """A cache verified against its meta.json, or one DataError naming it and the fix."""
    problem = damage(directory, meta)
    if problem:
        raise DataError(
            f"the token cache {directory} is damaged: {problem}; delete that folder and run again to rebuild it"
        )
    return PreparedData(dir=Path(directory), tokenizer_path=Path(directory) / TOKENIZER_FILE, meta=meta)


def _tokenizer_identity(cfg: DataConfig):
    """(what identifies the tokenizer in the cache key, the vocab size it will have)."""
    if cfg.tokenizer_path is None:
        check_vocab_size(cfg.vocab_size)
        return {"vocab_size": cfg.vocab_size, "train_bytes": cfg.tokenizer_train_bytes}, cfg.vocab_size
    tokenizer = load_tokenizer(cfg.tokenizer_path)
    roles = read_special_tokens(Path(cfg.tokenizer_path).parent)  # an imported tokenizer names its own
    special_token_ids(tokenizer, cfg.tokenizer_path, roles=roles)
    return {"file_hash": file_hash(cfg.tokenizer_path), "roles": roles}, tokenizer.get_vocab_size()


def cache_identity(cfg: DataConfig, tokenizer_identity: Optional[dict] = None) -> dict:
    """What the cache key is made of: every setting that changes what the cache holds — the corpus, the tokenizer,
    the budgets. Where it lives (cache_dir) and how training reads it (sampling) stay out: they reuse a cache."""
    return {
        "data": fingerprint(cfg),
        "tokenizer": tokenizer_identity or _tokenizer_identity(cfg)[0],
        "budgets": [cfg.token_budget, cfg.val_token_budget],
    }


def cache_key(identity: Dict[str, Any]) -> str:
    blob = json.dumps({"cache_version": CACHE_VERSION, **identity}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def _check_vocab(max_id: int, model_vocab: int, cfg: DataConfig) -> None:
    """Every id needs an embedding row: the largest id must be < model.vocab_size (more rows than ids is fine)."""
    if max_id < model_vocab:
        return
    if cfg.tokenizer_path is not None:
        raise DataError(
            f"tokenizer {cfg.tokenizer_path} has token ids up to {max_id} but model.vocab_size={model_vocab}; "
            f"set data.vocab_size={max_id + 1} (model.vocab_size follows it) or model.vocab_size>={max_id + 1}"
        )
    raise DataError(
        f"data.vocab_size={cfg.vocab_size} gives token ids up to {max_id} but model.vocab_size={model_vocab}; "
        f"set model.vocab_size>={max_id + 1} (it follows data.vocab_size unless set)"
    )


def prepare(
    cfg: DataConfig,
    *,
    seq_len: Optional[int] = None,
    model_vocab_size: Optional[int] = None,
    log: Callable[[str], None] = print,
) -> PreparedData:
    """Find the token cache for `cfg`, or build it; then check it fits seq_len and the model's vocabulary. A hit
    reads only meta.json (no `datasets` import, no write access: a shared read-only cache serves every run); a build
    takes a lock on data.cache_dir, one builder at a time. `log` gets progress (a wait for another builder: stderr)."""
    warn = log if log is not print else (lambda message: print(message, file=sys.stderr))
    check_config(cfg)
    tokenizer_identity, expected_vocab = _tokenizer_identity(cfg)
    if model_vocab_size is not None:  # fail before an expensive build
        _check_vocab(expected_vocab - 1, model_vocab_size, cfg)
    root = Path(cfg.cache_dir).resolve()
    if root.exists() and not root.is_dir():
        raise DataError(
            f"data.cache_dir={cfg.cache_dir} is a file, not a folder; point it at a folder (made if missing)"
        )
    directory = root / f"{cfg.source}-{cache_key(cache_identity(cfg, tokenizer_identity))}"
    meta = read_meta(directory)
    if meta is None:
        with _build_lock(root, warn):
            meta = read_meta(directory) or _build(cfg, directory, root, log)  # built while this one waited?
    else:
        log(f"data: using cache {directory}")
        _sweep_if_idle(root)
        if meta.get("val_rule"):
            log(f"data: validation: {meta['val_rule']}")
    data = open_cache(directory, meta)
    if model_vocab_size is not None:  # the real tokenizer's largest id, now that it exists
        _check_vocab(max_token_id(data.tokenizer()), model_vocab_size, cfg)
    for split, count in (("train", meta["train_tokens"]), ("validation", meta["val_tokens"])):
        if seq_len is not None and count <= seq_len + 1:
            raise DataError(
                f"the {split} split has {count} tokens, not more than seq_len+1={seq_len + 1}; lower "
                "trainer.seq_len or add data (data.val_fraction for validation)"
            )
    return data


@contextlib.contextmanager
def _build_lock(root: Path, warn):
    """One builder per cache folder — ranks of a torchrun job, concurrent runs: the others wait, then find it built."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        lock = open(root / ".prepare.lock", "w")
    except OSError as e:
        raise DataError(
            f"data.cache_dir {root} holds no cache for these settings and cannot be written to "
            f"({_cause(e)}); point data.cache_dir at a writable directory, or prepare the cache there "
            "first"
        ) from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            warn(f"data: waiting for another process preparing data in {root}")
            fcntl.flock(lock, fcntl.LOCK_EX)
        sweep_dead_builds(root)
        try:
            yield
        finally:  # leave nothing behind; at worst two builders, whose publish() keeps one cache
            with contextlib.suppress(OSError):
                os.unlink(root / ".prepare.lock")


def sweep_dead_builds(root: Path) -> None:
    """Remove every `<key>.tmp-<pid>` whose process is gone (a kill -9, a power cut), whatever settings it was for.
    Only while holding the build lock: a live builder on another host of a shared folder holds it too."""
    for temp in Path(root).glob("*.tmp-*"):
        pid = temp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(temp, ignore_errors=True)


def _sweep_if_idle(root: Path) -> None:
    """On a cache hit: sweep when no builder holds the lock and the folder is writable; otherwise leave it."""
    with contextlib.suppress(OSError), open(root / ".prepare.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        sweep_dead_builds(root)
        os.unlink(root / ".prepare.lock")  # as the build lock leaves nothing behind


def _cause(error: OSError) -> str:
    return os.strerror(error.errno).lower() if error.errno else str(error).splitlines()[0]


@contextlib.contextmanager
def publish(final: Path) -> Iterator[Path]:
    """A private temp directory, renamed to `final` on success, deleted on any failure: a killed build leaves only
    `<final>.tmp-<pid>` (swept once its process is gone: sweep_dead_builds), never something that looks like a cache.
    Concurrent builders of one key each finish a copy; the first rename wins (the contents are identical)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    temp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        yield temp
        if final.exists() and read_meta(final) is None:  # no meta.json: never a cache anyone can open; rebuilt
            shutil.rmtree(final)
        try:
            os.replace(temp, final)
        except OSError:
            if read_meta(final) is None:  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _build(cfg: DataConfig, directory: Path, root: Path, log) -> Dict[str, Any]:
    """_make_cache, with a write the disk refuses (full, quota, size limit, read-only) as one line."""
    try:
        return _make_cache(cfg, directory, log)
    except OSError as e:
        if e.errno not in WRITE_REFUSED:
            raise
        where = f" while writing {e.filename}" if e.filename else ""
        raise DataError(
            f"cannot prepare the data in {root}: {_cause(e)}{where}; nothing was kept (a half-built cache is "
            "deleted); free space there, or point data.cache_dir at another disk"
        ) from None


def _make_cache(cfg: DataConfig, directory: Path, log) -> Dict[str, Any]:
    start = time.perf_counter()
    log(f"data: preparing {cfg.source} into {directory}")
    with publish(directory) as work:
        # A local corpus's Arrow copy, as big as the corpus, is scratch: kept, one more copy per edit of the files.
        splits = load_splits(cfg, work / "hf_datasets")
        column, tokenizer_start = splits.text_column, time.perf_counter()
        if cfg.tokenizer_path is not None:  # its roles travel with it into the cache and every checkpoint
            shutil.copyfile(cfg.tokenizer_path, work / TOKENIZER_FILE)
            write_special_tokens(work, read_special_tokens(Path(cfg.tokenizer_path).parent))
            tokenizer = load_tokenizer(work / TOKENIZER_FILE)
        else:
            sample = splits.train
            # A corpus on disk larger than the tokenizer's share: documents spread over all of it, read in order (its
            # head alone could be one topic), ~20 % more than the share, as the table's bytes hold more than the text.
            if cfg.tokenizer_train_bytes and not cfg.streaming and sample.cache_files:
                share = (
                    1.2 * cfg.tokenizer_train_bytes * sample.data.num_rows / max(sample.data.nbytes * len(sample), 1)
                )
                sample = sample.select(hashed_choice(len(sample), cfg.seed + 1, share)[0]) if share < 1 else sample
            batches = (b[column] for b in sample.select_columns([column]).iter(batch_size=BATCH_SIZE))
            with progress_bar("data: training the tokenizer") as progress:
                texts = batched_texts(batches, cfg.tokenizer_train_bytes, progress)
                tokenizer = train_tokenizer(texts, cfg.vocab_size)
            tokenizer.save(str(work / TOKENIZER_FILE))
            if tokenizer.get_vocab_size() < cfg.vocab_size:
                log(
                    f"data: the corpus only supports {tokenizer.get_vocab_size()} of data.vocab_size={cfg.vocab_size} tokens"
                )
            log(
                f"data: trained a {tokenizer.get_vocab_size()}-token byte-level BPE in "
                f"{time.perf_counter() - tokenizer_start:.1f}s"
            )
        tokenizer_seconds = time.perf_counter() - tokenizer_start
        ids = special_token_ids(tokenizer, roles=read_special_tokens(work))
        dtype = "uint16" if tokenizer.get_vocab_size() < 65536 else "uint32"
        fast, why_not = fast_encoder(work / TOKENIZER_FILE)
        log(
            "data: encoding with tiktoken (the same ids as tokenizers, checked on each split's first documents)"
            if fast is not None
            else f"data: encoding with tokenizers: {why_not}"
        )
        encode_start, stats = time.perf_counter(), {}
        for name, split, budget in (
            ("train", splits.train, cfg.token_budget),
            ("val", splits.val, cfg.val_token_budget),
        ):
            out = work / f"{name}.bin"
            stats[name] = write_split(split, column, tokenizer, ids["eos_id"], out, dtype, budget, fast, log)
            if stats[name]["documents"] == 0:
                raise DataError(
                    f"the {name} split of {cfg.path or cfg.source} has no text after dropping empty "
                    f"documents (all {stats[name]['dropped']:,} are empty or have no "
                    f"'{column}' field); check data.text_column and the files"
                )
        shutil.rmtree(work / "hf_datasets", ignore_errors=True)  # never published
        meta = {
            "source": cfg.source,
            "config": asdict(cfg),
            "cache_version": CACHE_VERSION,
            "tokenizer_hash": file_hash(work / TOKENIZER_FILE),
            "tokenizer_trained": cfg.tokenizer_path is None,
            "vocab_size": tokenizer.get_vocab_size(),
            "dtype": dtype,
            **ids,
            "val_rule": splits.val_rule,
            "val_files": splits.val_files,
            **{f"{name}_{key}": value for name, s in stats.items() for key, value in s.items()},
            "prepare_seconds": round(time.perf_counter() - start, 3),
            "tokenizer_seconds": round(tokenizer_seconds, 3),
            "encode_seconds": round(time.perf_counter() - encode_start, 3),
        }
        (work / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n", encoding="utf-8")  # last
    log(
        f"data: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val tokens, "
        f"{meta['train_bytes'] / max(meta['train_tokens'], 1):.2f} bytes/token, {meta['prepare_seconds']:.1f}s"
    )
    if dropped := meta["train_dropped"] + meta["val_dropped"]:
        log(
            f"data: dropped {dropped:,} of {dropped + meta['train_documents'] + meta['val_documents']:,} documents with "
            f"no text (empty, whitespace only, or no '{column}' field: data.text_column)"
        )
    log(f"data: validation: {meta['val_rule']}")
    return meta


# ---- encoding --------------------------------------------------------------------------------------------------------


def usable_cores(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The cores this process may run on: its affinity, capped by its cgroup's CPU quota (a container's --cpus)."""
    cores, v2 = len(os.sched_getaffinity(0)), cgroup / "cpu.max"
    with contextlib.suppress(OSError, ValueError):  # no quota: "max" (cgroup v2) or -1 (v1)
        v1 = [(cgroup / f"cpu/cpu.cfs_{key}_us").read_text() for key in ("quota", "period")] if not v2.exists() else []
        quota, period = v1 or v2.read_text().split()
        cores = min(cores, math.ceil(int(quota) / int(period))) if int(quota) > 0 else cores
    return max(1, cores)


def progress_bar(what: str) -> tqdm:
    """What preparation is doing, MB done and MB/s on stderr, shown once a phase has taken more than 2 s."""
    return tqdm(desc=what, unit="B", unit_scale=True, unit_divisor=1000, delay=2, file=sys.stderr)


def fast_encoder(path: Path):
    """(a tiktoken Encoding of the tokenizer.json at `path`, '') or (None, why not). tiktoken merges, in each
    pre-token, the pair whose joined bytes have the lowest rank; BPE applies merges in the order training learnt them:
    with ranks = ids, the two agree on a vocabulary BPE training made, under GPT-2's pre-tokenizer."""
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    spec = json.loads(Path(path).read_text())
    model, pre, added = spec.get("model") or {}, spec.get("pre_tokenizer") or {}, spec.get("added_tokens", [])
    shape = {  # setting: (this tokenizer's, the only one tiktoken reproduces)
        "model": (model.get("type"), "BPE"),
        "pre_tokenizer": (pre.get("type"), "ByteLevel"),
        "use_regex": (pre.get("use_regex"), True),
        "add_prefix_space": (pre.get("add_prefix_space"), False),
        "normalizer": (spec.get("normalizer"), None),
        "post_processor": (spec.get("post_processor"), None),
        "dropout": (model.get("dropout"), None),
        "continuing_subword_prefix": (model.get("continuing_subword_prefix"), None),
        "end_of_word_suffix": (model.get("end_of_word_suffix"), None),
        "byte_fallback": (model.get("byte_fallback") or False, False),
    }
    if differs := [f"{k}={have}" for k, (have, want) in shape.items() if have != want]:
        return None, f"not a plain byte-level BPE ({', '.join(differs)})"
    if any(t.get(k) for t in added for k in ("single_word", "lstrip", "rstrip", "normalized")):
        return None, "an added token strips spaces, matches whole words or is normalized"
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars = dict(zip(printable, map(chr, printable)))
    chars.update({b: chr(256 + n) for n, b in enumerate(b for b in range(256) if b not in chars)})  # GPT-2's bytes
    decode, special = {c: b for b, c in chars.items()}, {t["content"]: t["id"] for t in added}
    ranks = {}
    for token, rank in model["vocab"].items():
        if token not in special:
            if any(c not in decode for c in token):
                return None, f"token {token!r} is not byte-level"
            ranks[bytes(decode[c] for c in token)] = rank
    previous = -1
    for merge in model.get("merges", []):  # rank order is merge order only if each merge makes a later id
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        made = model["vocab"].get(left + right)
        if made is None or made <= previous:
            return None, "its merges are not in the order of their tokens' ids"
        previous = made
    return tiktoken.Encoding(
        f"minillama-{Path(path).parent.name}", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=special
    ), ""


def fast_ids(fast, text: str) -> np.ndarray:
    """One document's ids straight from tiktoken's buffer (added tokens matched in the text, as `tokenizers` does)."""
    return fast.encode_to_numpy(text, allowed_special="all")


def _windows(dataset, column: str) -> Iterator[tuple]:
    """(texts, their UTF-8 bytes, documents without text) in order, cut into windows of at most ENCODE_BYTES."""
    for table in dataset.select_columns([column]).with_format("arrow").iter(batch_size=BATCH_SIZE):
        rows = table.column(column).to_pylist()
        texts = [t for t in rows if t and not t.isspace()]
        dropped, sizes, first, size = len(rows) - len(texts), [len(t.encode("utf-8")) for t in texts], 0, 0
        for i, n in enumerate(sizes):
            size += n
            if size >= ENCODE_BYTES or i == len(texts) - 1:
                yield texts[first : i + 1], np.array(sizes[first : i + 1], dtype=np.int64), dropped
                first, size, dropped = i + 1, 0, 0
        if not texts:
            yield [], np.empty(0, dtype=np.int64), dropped


def encode_documents(tokenizer: Tokenizer, texts: list, eos_id: int) -> list:
    """Each text's ids followed by EOS, through `tokenizers` (every core, from Rust)."""
    return [np.array(e.ids + [eos_id], dtype=np.int64) for e in tokenizer.encode_batch(texts)]


def write_split(
    dataset,
    column: str,
    tokenizer: Tokenizer,
    eos_id: int,
    out: Path,
    dtype: str,
    budget: Optional[int],
    fast=None,
    log=print,
) -> dict:
    """Tokenize `dataset` into `out`, stopping after the document that reaches `budget` tokens (a whole document: the
    byte count stays exact). Windows are written as they come; tiktoken encodes one document per task in a thread
    pool (it releases the GIL), the next window submitted before this one is written: at most two in flight."""
    name = out.stem  # train | val
    if fast is not None:
        sample, seen = [], 0
        for texts, sizes, _ in _windows(dataset, column):
            for text, n in zip(texts, sizes):
                if seen < CHECK_BYTES:
                    sample.append(text)
                    seen += int(n)
            if seen >= CHECK_BYTES:
                break
        if [e.ids for e in tokenizer.encode_batch(sample)] != [fast_ids(fast, t).tolist() for t in sample]:
            log(
                f"data: tiktoken's ids differ from tokenizers' on the {name} split's first documents: encoding it with "
                "tokenizers (slower)"
            )
            fast = None
    stats = dict(tokens=0, bytes=0, documents=0, dropped=0, max_id=-1, encoder="tiktoken" if fast else "tokenizers")
    sha = hashlib.sha256()
    eos = np.array([eos_id], dtype=np.uint32)

    def write(started, sizes: np.ndarray, dropped: int) -> bool:
        """One window into the file; whether the budget is reached."""
        docs = [np.concatenate([ids, eos]) for ids in started] if fast is not None else started
        lengths, kept = np.array([len(d) for d in docs], dtype=np.int64), len(docs)
        if budget is not None and kept:
            kept = min(kept, int(np.searchsorted(np.cumsum(lengths), budget - stats["tokens"])) + 1)
        flat = np.concatenate(docs[:kept]).astype(dtype) if kept else np.empty(0, dtype=dtype)
        file.write(flat.tobytes())
        sha.update(flat.tobytes())
        stats.update(
            max_id=max(stats["max_id"], int(flat.max()) if len(flat) else -1),
            tokens=stats["tokens"] + len(flat),
            bytes=stats["bytes"] + int(sizes[:kept].sum()),
            documents=stats["documents"] + kept,
            dropped=stats["dropped"] + dropped,
        )
        progress.update(int(sizes[:kept].sum()))
        return budget is not None and stats["tokens"] >= budget  # for a stream this stops the download too

    with (
        ThreadPoolExecutor(max_workers=usable_cores()) as pool,
        open(out, "wb") as file,
        progress_bar(f"data: encoding {name}") as progress,
    ):
        in_flight = deque()
        for texts, sizes, dropped in _windows(dataset, column):
            started = (
                pool.map(functools.partial(fast_ids, fast), texts)
                if fast is not None
                else encode_documents(tokenizer, texts, eos_id)
            )
            in_flight.append((started, sizes, dropped))
            if len(in_flight) == 2 and write(*in_flight.popleft()):
                return {**stats, "sha256": sha.hexdigest()}
        while in_flight and not write(*in_flight.popleft()):
            pass
    return {**stats, "sha256": sha.hexdigest()}
