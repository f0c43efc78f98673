"""Holding out validation when the source has no split of its own: whole files, or whole documents.

Validation paragraphs taken from the same books as training ones make the validation loss
optimistic, so several local text files give up whole files; one file (or a table of documents)
gives up whole documents. Both choices are fixed by data.seed and say what they held out.
"""
import hashlib
import os
from functools import partial
from pathlib import Path
from typing import List, Tuple

import numpy as np

from data.config import DataConfig
from data.errors import DataError

NAMES_SHOWN = 5  # held-out file names in the one-line summary; meta.json lists them all


def hold_out_files(files: List[Path], fraction: float, seed: int) -> List[Path]:
    """The files that become validation: whole files, about `fraction` of the bytes.

    The rule: go through the files in an order fixed by a hash of (seed, the file's path relative
    to their common folder), and hold a file out when that brings the held-out bytes closer to
    `fraction` of all bytes. At least one file (the smallest, if each alone overshoots by more
    than the target), never all of them. Moving or renaming the folder does not change the choice.
    """
    if len(files) < 2:
        raise ValueError("hold_out_files needs at least two files")
    names = relative_names(files)
    sizes = [f.stat().st_size for f in files]
    order = sorted(range(len(files)), key=lambda i: (_name_hash(seed, names[i]), names[i]))
    target, held, total = fraction * sum(sizes), [], 0
    for i in order:
        if len(held) == len(files) - 1:
            break
        if total + sizes[i] / 2 < target:  # |total + size - target| < |total - target|
            held.append(i)
            total += sizes[i]
    if not held:
        held = [min(order, key=lambda i: sizes[i])]
    return [files[i] for i in sorted(held)]


def describe_held_files(held: List[Path], files: List[Path], fraction: float) -> str:
    """`2 of 7 files held out whole (5.3% of the bytes): a.txt, b.txt`, and a hint when few big
    files make that share far larger than `fraction`."""
    names = dict(zip(files, relative_names(files)))
    share = sum(f.stat().st_size for f in held) / max(sum(f.stat().st_size for f in files), 1)
    shown = ", ".join(names[f] for f in held[:NAMES_SHOWN])
    more = f" and {len(held) - NAMES_SHOWN} more (listed in meta.json)" if len(held) > NAMES_SHOWN else ""
    hint = ""
    if share > 2 * fraction:
        hint = (f"; that is more than data.val_fraction={fraction} because whole files are held out: split the "
                "corpus into more files, or name a validation file (a folder with train.txt and validation.txt)")
    return f"{len(held)} of {len(files)} files held out whole ({share:.1%} of the bytes): {shown}{more}{hint}"


def relative_names(files: List[Path]) -> List[str]:
    """Paths relative to the files' common folder: the same names wherever the corpus is moved."""
    root = os.path.commonpath([str(Path(f).resolve().parent) for f in files])
    return [Path(os.path.relpath(Path(f).resolve(), root)).as_posix() for f in files]


def _name_hash(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}/{name}".encode("utf-8")).digest()[:8], "big")


def hold_out_documents(train, cfg: DataConfig, where: str) -> Tuple[object, object, str]:
    """(train, validation, rule): a deterministic `val_fraction` of whole documents."""
    import datasets

    if isinstance(train, datasets.IterableDataset):
        # A stream has no length to split by count: each document goes to validation by a hash
        # of (seed, its index), so the same documents are held out on every pass.
        keep = partial(_validation_mask, seed=cfg.seed, fraction=cfg.val_fraction)
        return (train.filter(partial(keep, want=False), with_indices=True, batched=True),
                train.filter(partial(keep, want=True), with_indices=True, batched=True),
                f"about {cfg.val_fraction:.0%} of the streamed documents, chosen by a hash of data.seed")
    if len(train) < 2:
        finer = {"document": "use data.sample_by=paragraph (or line)", "paragraph": "use data.sample_by=line"}
        ways = [finer[cfg.sample_by]] if cfg.sample_by in finer else []
        raise DataError(f"{where} has {len(train)} document(s), too few to hold out validation (data.sample_by="
                        f"{cfg.sample_by}); {', '.join(ways + ['add documents or files'])}, or give a validation split "
                        "(data.val_split)")
    parts = train.train_test_split(test_size=cfg.val_fraction, seed=cfg.seed)
    rule = f"{len(parts['test']):,} of {len(train):,} documents ({cfg.val_fraction:.0%}), chosen by data.seed"
    return parts["train"], parts["test"], rule


def _validation_mask(batch, indices, seed: int, fraction: float, want: bool) -> List[bool]:
    mask = uniform_hash(seed, np.asarray(indices)) < fraction
    return list(mask == want)


def uniform_hash(seed: int, indices: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) per (seed, index): splitmix64, vectorised."""
    mix = np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    x = indices.astype(np.uint64) + mix  # uint64 arrays wrap around silently: that is the hash
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) / float(1 << 53)
