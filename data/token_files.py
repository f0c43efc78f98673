"""Tokenize a split with `datasets.map` and write it as one flat file of token ids, EOS after each document."""
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Optional

import numpy as np
import pyarrow.compute as pc
from tokenizers import Tokenizer
from tqdm.auto import tqdm

BATCH_SIZE = 1000  # documents per `encode_batch` call: enough to keep every core busy


@dataclass
class SplitStats:
    tokens: int = 0
    bytes: int = 0  # UTF-8 bytes of the documents behind the tokens: the denominator of bits-per-byte
    documents: int = 0
    dropped: int = 0  # documents without text: empty, whitespace only, or missing the text field


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
                num_proc: int, name: str, work_dir: Path) -> SplitStats:
    """Tokenize `dataset` into `out`, stopping after the document that reaches `budget` tokens.

    Stopping at a document boundary keeps the byte count exact (bits-per-byte needs it); the
    overshoot is at most one document. Batches are written as they come, so memory stays flat
    however long the stream is.
    """
    import datasets

    tokenized = _tokenize(dataset, encoder, num_proc, name, work_dir, dtype)
    stats = SplitStats()
    streaming = isinstance(dataset, datasets.IterableDataset)  # map-style shows datasets' own bar
    progress = tqdm(total=budget, unit="tok", unit_scale=True, desc=f"Writing {name}", disable=not streaming)
    with open(out, "wb") as file:
        for table in tokenized.with_format("arrow").iter(batch_size=BATCH_SIZE):
            empty = pc.equal(pc.list_value_length(table.column("ids")), 0)
            stats.dropped += int(pc.sum(empty).as_py() or 0)
            table = table.filter(pc.invert(empty))
            ids, lengths = table.column("ids"), pc.list_value_length(table.column("ids")).to_numpy()
            num_bytes = table.column("num_bytes").to_numpy()
            kept = len(lengths)
            if budget is not None and kept:
                ends = np.cumsum(lengths)
                kept = min(kept, int(np.searchsorted(ends, budget - stats.tokens)) + 1)
            flat = pc.list_flatten(ids.slice(0, kept)).to_numpy().astype(dtype, copy=False)
            file.write(flat.tobytes())
            stats.tokens += len(flat)
            stats.bytes += int(num_bytes[:kept].sum())
            stats.documents += kept
            progress.update(len(flat))
            if budget is not None and stats.tokens >= budget:
                break  # for a stream this stops the download too
    progress.close()
    return stats


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
