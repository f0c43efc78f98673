"""Sources: a DataConfig becomes train and validation datasets of documents (map-style or streamed)."""
import glob
import os
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Dict, List

import numpy as np

from data.config import SOURCES, DataConfig
from data.errors import DataError
from data.hub import load_hub_dataset
from data.shakespeare import load_plays, plays_dir

HUB_PATHS = {"tinystories": "roneneldan/TinyStories", "fineweb_edu": "HuggingFaceFW/fineweb-edu"}
# File extension -> `datasets` builder. Compressed files are read through their inner extension.
BUILDERS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
            ".parquet": "parquet", ".csv": "csv"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
SAMPLE_BY = ("paragraph", "document", "line")


@dataclass
class Splits:
    train: Any  # datasets.Dataset, or datasets.IterableDataset when streaming
    val: Any
    text_column: str


def check_config(cfg: DataConfig) -> None:
    """Reject settings that can never work, before any file is read."""
    if cfg.source not in SOURCES:
        raise DataError(f"unknown data source '{cfg.source}'; choose one of {', '.join(SOURCES)} (e.g. data=shakespeare)")
    if cfg.source == "local" and not (cfg.path or cfg.data_files):
        raise DataError("data=local needs files: set data.path=<file, glob or folder>, e.g. data.path='corpus/*.txt'")
    if cfg.sample_by not in SAMPLE_BY:
        raise DataError(f"data.sample_by={cfg.sample_by!r} is unknown; choose one of {', '.join(SAMPLE_BY)}")
    if not 0.0 < cfg.val_fraction < 1.0:
        raise DataError(f"data.val_fraction={cfg.val_fraction} must lie strictly between 0 and 1, e.g. 0.05")
    for key in ("token_budget", "val_token_budget", "tokenizer_train_bytes"):
        if getattr(cfg, key) is not None and getattr(cfg, key) <= 0:
            raise DataError(f"data.{key}={getattr(cfg, key)} must be positive, or null for no limit")
    if cfg.num_proc < 1:
        raise DataError(f"data.num_proc={cfg.num_proc} must be at least 1")
    if cfg.seed < 0:
        raise DataError(f"data.seed={cfg.seed} must be non-negative")


def fingerprint(cfg: DataConfig) -> Dict[str, Any]:
    """What identifies the corpus: settings plus (size, mtime) of every local file, so an edited file
    invalidates the cache. Cheap and free of `datasets`, so a cache hit stays instant."""
    identity = {key: getattr(cfg, key) for key in
                ("source", "text_column", "train_split", "val_split", "val_fraction", "seed", "streaming")}
    if cfg.source == "shakespeare":
        identity["files"] = _stamp(sorted(plays_dir().glob("*/*.md")))
    elif cfg.source == "local":
        kind, files = resolve_local(cfg)
        identity.update(kind=kind, files=_stamp(files), sample_by=cfg.sample_by if kind == "text" else None)
    else:
        path = hub_path(cfg)
        identity.update(path=path, name=cfg.name, data_files=list(cfg.data_files))
        if os.path.isdir(path):
            identity["files"] = _stamp(_files_under(Path(path)))
    return identity


def load_splits(cfg: DataConfig, hf_cache_dir: Path) -> Splits:
    """Train and validation documents for `cfg`; validation is held out of train when the source has none."""
    import datasets

    text_column, where = cfg.text_column, cfg.path
    if cfg.source == "shakespeare":
        splits, text_column, where = {"train": datasets.Dataset.from_list(load_plays())}, "text", "the Shakespeare plays"
    elif cfg.source == "local":
        splits, text_column = _load_local(cfg, hf_cache_dir)
    else:
        path = where = hub_path(cfg)
        cache = str(hf_cache_dir) if os.path.isdir(path) else None  # hub downloads use the shared HF cache
        splits = load_hub_dataset(path, cfg.name, list(cfg.data_files), cfg.streaming, cache)
    train, val = _pick_splits(splits, cfg, where)
    for split in (train, val):
        _check_text_column(split, text_column, where)
    return Splits(train=train, val=val, text_column=text_column)


def hub_path(cfg: DataConfig) -> str:
    return cfg.path or HUB_PATHS[cfg.source]


def resolve_local(cfg: DataConfig):
    """("saved" | "folder" | builder name, files) for the local source; missing or empty files are errors."""
    patterns = ([cfg.path] if cfg.path else []) + list(cfg.data_files)
    if len(patterns) == 1 and os.path.isdir(patterns[0]):
        root = Path(patterns[0])
        saved = (root / "dataset_dict.json").exists() or (root / "state.json").exists()
        files, kind = _files_under(root), "saved" if saved else "folder"
        if not files:
            raise DataError(f"folder '{root}' holds no files; point data.path at your data files")
    else:
        files = [Path(f) for pattern in patterns for f in _expand(pattern)]
        kind = _builder_for(files)
    for file in files:
        if file.stat().st_size == 0:
            raise DataError(f"file '{file}' is empty; remove it or fix data.path")
    return kind, files


def _expand(pattern: str) -> List[str]:
    if os.path.isdir(pattern):
        raise DataError(f"'{pattern}' is a folder: give it alone as data.path (no data.data_files), or glob its files")
    matches = sorted(f for f in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(f))
    if not matches:
        raise DataError(f"data.path '{pattern}' matches no files (relative to {os.getcwd()}); check the path or glob")
    return matches


def _builder_for(files: List[Path]) -> str:
    builders = set()
    for file in files:
        suffixes = [s for s in file.suffixes if s not in COMPRESSIONS]
        builder = BUILDERS.get(suffixes[-1].lower() if suffixes else "")
        if builder is None:
            raise DataError(f"cannot read '{file}': supported files are {', '.join(BUILDERS)} (optionally compressed)")
        builders.add(builder)
    if len(builders) > 1:
        raise DataError(f"data.path mixes file kinds ({', '.join(sorted(builders))}); use one kind per dataset")
    return builders.pop()


def _load_local(cfg: DataConfig, hf_cache_dir: Path):
    import datasets

    kind, files = resolve_local(cfg)
    if kind == "saved":
        loaded = datasets.load_from_disk(cfg.path)
        splits = loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return splits, cfg.text_column
    if kind == "folder":  # a folder laid out like a hub dataset: the hub loader infers its splits
        return load_hub_dataset(cfg.path, cfg.name, None, cfg.streaming, str(hf_cache_dir)), cfg.text_column
    options = {"sample_by": cfg.sample_by} if kind == "text" else {}
    try:
        splits = datasets.load_dataset(kind, data_files={"train": [str(f) for f in files]},
                                       streaming=cfg.streaming, cache_dir=str(hf_cache_dir), **options)
    except datasets.exceptions.DatasetsError as error:
        cause = error.__cause__ or error
        reason = str(cause).splitlines()[0]
        raise DataError(f"cannot read {kind} files from data.path '{cfg.path}': {reason}; fix or remove the bad file") from None
    # The text builder always names its column "text", whatever data.text_column says.
    return splits, "text" if kind == "text" else cfg.text_column


def _pick_splits(splits, cfg: DataConfig, where: str):
    names = list(splits.keys())
    if cfg.train_split not in splits:
        raise DataError(f"{where} has no split '{cfg.train_split}' (splits: {', '.join(names)}); set data.train_split")
    if cfg.val_split is not None and cfg.val_split not in splits:
        raise DataError(f"{where} has no split '{cfg.val_split}' (splits: {', '.join(names)}); "
                        "set data.val_split, or null to hold out data.val_fraction")
    val_name = cfg.val_split or ("validation" if "validation" in splits else None)
    if val_name is not None:
        return splits[cfg.train_split], splits[val_name]
    return _hold_out(splits[cfg.train_split], cfg, where)


def _hold_out(train, cfg: DataConfig, where: str):
    """Split off a deterministic `val_fraction` of documents (whole documents, never pieces)."""
    import datasets

    if isinstance(train, datasets.IterableDataset):
        # A stream has no length to split by count: each document goes to validation by a hash
        # of (seed, its index), so the same documents are held out on every pass.
        keep = partial(_validation_mask, seed=cfg.seed, fraction=cfg.val_fraction)
        return (train.filter(partial(keep, want=False), with_indices=True, batched=True),
                train.filter(partial(keep, want=True), with_indices=True, batched=True))
    if len(train) < 2:
        raise DataError(f"{where} has {len(train)} document(s), too few to hold out validation; "
                        "add documents, use data.sample_by=paragraph, or give a validation split")
    parts = train.train_test_split(test_size=cfg.val_fraction, seed=cfg.seed)
    return parts["train"], parts["test"]


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


def _check_text_column(split, column: str, where: str) -> None:
    features = split.features
    if features is None:  # a stream of unknown schema: look at its first document
        first = next(iter(split.take(1)), {})
        features = {k: type(v).__name__ for k, v in first.items()}
    if column not in features:
        raise DataError(f"text column '{column}' not found in {where} (columns: {', '.join(features) or 'none'}); set data.text_column")
    dtype = getattr(features[column], "dtype", features[column])
    if dtype not in ("string", "large_string", "str"):
        raise DataError(f"column '{column}' in {where} holds {dtype}, not text; set data.text_column to a text column")


def _files_under(root: Path) -> List[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))


def _stamp(files: List[Path]) -> List[list]:
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]
