"""Tokenize a split and write it as one flat file of token ids, EOS after each document: with tiktoken's
encoder where the tokenizer qualifies (data/encoding.py; checked against `tokenizers` on the split's first
documents), else `tokenizers` through `datasets.map`."""
import functools
import os
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, Optional, Tuple

import numpy as np
import pyarrow.compute as pc
from tokenizers import Tokenizer
from tqdm.auto import tqdm

BATCH_SIZE = 1000  # documents per `encode_batch` call: enough to keep every core busy
ENCODE_BYTES = 4 * 1024 * 1024  # text per window in flight (memory, not speed: see _windows)
CHECK_BYTES = 256 * 1024  # the fast encoder's ids are compared with `tokenizers`' on this much of each split


@dataclass
class SplitStats:
    tokens: int = 0
    bytes: int = 0  # UTF-8 bytes of the documents behind the tokens: the denominator of bits-per-byte
    documents: int = 0
    dropped: int = 0  # documents without text: empty, whitespace only, or missing the text field
    encoder: str = "tokenizers"  # or "tiktoken": which encoded the split (the same ids either way)


class DocumentEncoder:
    """The batched map function: texts -> token ids + EOS, and each text's UTF-8 byte count.

    A document without text (empty, whitespace only, or None: a jsonl row without the field) gives an
    empty row, which the writer counts and drops. A class rather than a closure so `datasets` can
    pickle it into `num_proc` workers.
    """

    def __init__(self, tokenizer: Tokenizer, text_column: str, eos_id: int):
        self.tokenizer, self.text_column, self.eos_id = tokenizer, text_column, eos_id

    def __call__(self, batch: Dict[str, list]) -> Dict[str, list]:
        rows = batch[self.text_column]
        kept = [i for i, t in enumerate(rows) if t and not t.isspace()]
        encodings = iter(self.tokenizer.encode_batch([rows[i] for i in kept]))
        ids, num_bytes, keep = [], [], set(kept)
        for i, text in enumerate(rows):
            ids.append(next(encodings).ids + [self.eos_id] if i in keep else [])
            num_bytes.append(len(text.encode("utf-8")) if i in keep else 0)
        return {"ids": ids, "num_bytes": num_bytes}


def write_split(dataset, encoder: DocumentEncoder, out: Path, dtype: str, budget: Optional[int],
                num_proc: int, name: str, work_dir: Path, fast=None, log=print) -> SplitStats:
    """Tokenize `dataset` into `out`, stopping after the document that reaches `budget` tokens.

    Stopping at a document boundary keeps the byte count exact (bits-per-byte needs it); the
    overshoot is at most one document. Batches are written as they come, so memory stays flat
    however long the stream is. `fast`: a tiktoken Encoding of the same tokenizer (data/encoding.py),
    used once its ids match `tokenizers`' on the split's first CHECK_BYTES.
    """
    import datasets

    streaming = isinstance(dataset, datasets.IterableDataset)  # map-style shows datasets' own bar
    if fast is not None and not agrees(fast, encoder, dataset):
        log(f"data: tiktoken's ids differ from tokenizers' on the {name} split's first documents: encoding it "
            "with tokenizers (slower)")
        fast = None
    batches = _fast_batches(dataset, encoder, fast) if fast is not None else \
        _mapped_batches(_tokenize(dataset, encoder, num_proc, name, work_dir, dtype))
    stats = SplitStats(encoder="tokenizers" if fast is None else "tiktoken")
    progress = tqdm(total=budget, unit="tok", unit_scale=True, desc=f"Writing {name}",
                    disable=not (streaming or fast is not None))
    with open(out, "wb") as file:
        for ids, lengths, num_bytes, dropped in batches:
            stats.dropped += dropped
            kept = len(lengths)
            if budget is not None and kept:
                ends = np.cumsum(lengths)
                kept = min(kept, int(np.searchsorted(ends, budget - stats.tokens)) + 1)
            flat = ids[:int(lengths[:kept].sum())].astype(dtype, copy=False)
            file.write(flat.tobytes())
            stats.tokens += len(flat)
            stats.bytes += int(num_bytes[:kept].sum())
            stats.documents += kept
            progress.update(len(flat))
            if budget is not None and stats.tokens >= budget:
                break  # for a stream this stops the download too
    progress.close()
    return stats


def _mapped_batches(tokenized) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """(the batch's ids, EOS included, flat; each document's length; its bytes; documents dropped) from
    datasets.map's output."""
    for table in tokenized.with_format("arrow").iter(batch_size=BATCH_SIZE):
        empty = pc.equal(pc.list_value_length(table.column("ids")), 0)
        table = table.filter(pc.invert(empty))
        yield (pc.list_flatten(table.column("ids")).to_numpy(), pc.list_value_length(table.column("ids")).to_numpy(),
               table.column("num_bytes").to_numpy(), int(pc.sum(empty).as_py() or 0))


def _texts(dataset, column: str) -> Iterator[Tuple[list, np.ndarray, int]]:
    """(the batch's documents with text, their UTF-8 bytes, how many had none), batch by batch."""
    for table in dataset.select_columns([column]).with_format("arrow").iter(batch_size=BATCH_SIZE):
        rows = table.column(column).to_pylist()
        kept = [t for t in rows if t and not t.isspace()]
        yield kept, np.array([len(t.encode("utf-8")) for t in kept], dtype=np.int64), len(rows) - len(kept)


def _windows(dataset, column: str) -> Iterator[Tuple[list, np.ndarray, int]]:
    """_texts cut into windows of at most ENCODE_BYTES of text (one bigger document goes alone): the unit of work
    in flight, so memory follows it, not the corpus. A batch's dropped documents are counted with its first."""
    for texts, num_bytes, dropped in _texts(dataset, column):
        first, size = 0, 0
        for i, n in enumerate(num_bytes):
            size += int(n)
            if size >= ENCODE_BYTES or i == len(texts) - 1:
                yield texts[first:i + 1], num_bytes[first:i + 1], dropped
                first, size, dropped = i + 1, 0, 0
        if not texts:
            yield [], num_bytes, dropped


def fast_ids(fast, text: str) -> np.ndarray:
    """One document's ids as a uint32 array straight from tiktoken's buffer: no Python int per token."""
    return fast.encode_to_numpy(text, allowed_special="all")


def _joined(encoded: Iterator[np.ndarray], num_bytes: np.ndarray, dropped: int, eos: np.ndarray):
    """A window's documents as _mapped_batches gives them: ids with EOS after each, flat; lengths; bytes; dropped."""
    arrays = list(encoded)
    if not arrays:
        return np.empty(0, dtype=np.uint32), np.empty(0, dtype=np.int64), num_bytes, dropped
    pieces = [part for ids in arrays for part in (ids, eos)]
    return np.concatenate(pieces), np.array([len(ids) + 1 for ids in arrays], dtype=np.int64), num_bytes, dropped


def _fast_batches(dataset, encoder: DocumentEncoder, fast) -> Iterator[Tuple[np.ndarray, np.ndarray, np.ndarray, int]]:
    """What _mapped_batches gives, encoded by tiktoken on every core: one document per task in a thread pool
    (tiktoken releases the GIL while it encodes), the next window submitted before this one is joined and
    written, so the cores stay busy while the writer works; at most two windows in flight."""
    eos = np.array([encoder.eos_id], dtype=np.uint32)
    with ThreadPoolExecutor(max_workers=max(1, len(os.sched_getaffinity(0)))) as pool:
        in_flight = deque()
        for texts, num_bytes, dropped in _windows(dataset, encoder.text_column):
            in_flight.append((pool.map(functools.partial(fast_ids, fast), texts), num_bytes, dropped))
            if len(in_flight) == 2:
                yield _joined(*in_flight.popleft(), eos)
        while in_flight:
            yield _joined(*in_flight.popleft(), eos)


def agrees(fast, encoder: DocumentEncoder, dataset) -> bool:
    """Whether tiktoken (as _fast_batches calls it) and `tokenizers` give the same ids on the split's first
    CHECK_BYTES of documents."""
    sample, seen = [], 0
    for texts, num_bytes, _ in _texts(dataset, encoder.text_column):
        for text, size in zip(texts, num_bytes):
            sample.append(text)
            seen += int(size)
            if seen >= CHECK_BYTES:
                break
        if seen >= CHECK_BYTES:
            break
    ours = [e.ids for e in encoder.tokenizer.encode_batch(sample)]
    return ours == [fast_ids(fast, text).tolist() for text in sample]


def _tokenize(dataset, encoder: DocumentEncoder, num_proc: int, name: str, work_dir: Path, dtype: str):
    import datasets

    features = datasets.Features({"ids": datasets.List(datasets.Value(dtype)), "num_bytes": datasets.Value("int64")})
    # Only the text column goes in, so every input column can be removed.
    dataset = dataset.select_columns([encoder.text_column])
    common = dict(batched=True, batch_size=BATCH_SIZE, remove_columns=[encoder.text_column], features=features)
    if isinstance(dataset, datasets.IterableDataset):
        return dataset.map(encoder, **common)  # lazy: runs while `write_split` iterates
    return dataset.map(
        encoder,
        num_proc=num_proc if num_proc > 1 and len(dataset) > 1 else None,
        desc=f"Tokenizing {name}",
        # Intermediate Arrow files live in the cache's temp directory, deleted with it: no
        # growth of ~/.cache across runs. The fingerprint names them without hashing the tokenizer.
        cache_file_name=str(work_dir / f"tokenized-{name}.arrow"),
        new_fingerprint=f"minillama-{name}-{work_dir.name}",
        **common,
    )
