"""Sources: a DataConfig becomes train and validation datasets of documents (map-style or streamed)."""
import glob
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from data.config import SOURCES, DataConfig
from data.errors import DataError
from data.hub import load_hub_dataset
from data.shakespeare import load_plays, plays_dir
from data.validation import describe_held_files, hold_out_documents, hold_out_files, relative_names

HUB_PATHS = {"tinystories": "roneneldan/TinyStories", "fineweb_edu": "HuggingFaceFW/fineweb-edu"}
# File extension -> `datasets` builder. Compressed files are read through their inner extension.
BUILDERS = {".txt": "text", ".text": "text", ".md": "text", ".json": "json", ".jsonl": "json",
            ".parquet": "parquet", ".csv": "csv"}
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
SAMPLE_BY = ("paragraph", "document", "line")
# Files a hub-style folder may hold that are not data (datasets' own FILES_TO_IGNORE).
NOT_DATA = ("README.md", "config.json", "dataset_info.json", "dataset_infos.json", "dummy_data.zip",
            "dataset_dict.json")


@dataclass
class Splits:
    train: Any  # datasets.Dataset, or datasets.IterableDataset when streaming
    val: Any
    text_column: str
    val_rule: str = ""  # where validation came from, for the prepare log and meta.json
    val_files: Optional[List[str]] = None  # the files held out whole, if that is how


def check_config(cfg: DataConfig) -> None:
    """Reject settings that can never work, before any file is read."""
    if cfg.source not in SOURCES:
        raise DataError(f"unknown data source '{cfg.source}'; choose one of {', '.join(SOURCES)} (e.g. data=shakespeare)")
    if cfg.source == "local" and not (cfg.path or cfg.data_files):
        raise DataError("data=local needs files: set data.path=<file, glob or folder>, e.g. data.path='corpus/*.txt'")
    if cfg.source == "hub" and not cfg.path:
        raise DataError("data=hub needs the dataset: set data.path=<hub id>, e.g. data.path=roneneldan/TinyStories "
                        "(and data.name=<config>, data.text_column=<column> if it has them)")
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
        text = kind == "text" or (kind == "folder" and _all_text(_data_files(files)))
        identity.update(kind=kind, files=_stamp(files), sample_by=cfg.sample_by if text else None)
    else:
        path = hub_path(cfg)
        identity.update(path=path, name=cfg.name, data_files=list(cfg.data_files))
        if os.path.isdir(path):
            identity["files"] = _stamp(_files_under(Path(path)))
    return identity


def load_splits(cfg: DataConfig, hf_cache_dir: Path) -> Splits:
    """Train and validation documents for `cfg`; validation is held out of train when the source has none."""
    import datasets

    text_column, where, held = cfg.text_column, cfg.path, None
    if cfg.source == "shakespeare":
        splits, text_column, where = {"train": datasets.Dataset.from_list(load_plays())}, "text", "the Shakespeare plays"
    elif cfg.source == "local":
        splits, text_column, held = _load_local(cfg, hf_cache_dir)
    else:
        path = where = hub_path(cfg)
        cache = str(hf_cache_dir) if os.path.isdir(path) else None  # hub downloads use the shared HF cache
        splits = load_hub_dataset(path, cfg.name, list(cfg.data_files), cfg.streaming, cache)
    train, val, rule = _pick_splits(splits, cfg, where)
    for split in (train, val):
        _check_text_column(split, text_column, where)
    if held is not None:  # plain text files: (held-out files, all files)
        held_files, files = held
        if held_files:
            return Splits(train, val, text_column, describe_held_files(held_files, files, cfg.val_fraction),
                          [n for f, n in zip(files, relative_names(files)) if f in held_files])
        if len(files) == 1:
            rule = (f"{rule}, from the one text file {files[0].name} (data.sample_by={cfg.sample_by}); "
                    "with several files, whole files are held out")
    return Splits(train=train, val=val, text_column=text_column, val_rule=rule)


def hub_path(cfg: DataConfig) -> str:
    """The dataset id (or a local folder in the hub's layout) of a hub source."""
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
        if not saved and not any(_builder_of(f) for f in _data_files(files)):
            found = ", ".join(f.name for f in files[:3]) + (", …" if len(files) > 3 else "")
            raise DataError(f"folder '{root}' holds no text data ({found}); supported files are "
                            f"{', '.join(BUILDERS)} (optionally compressed)")
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
        builder = _builder_of(file)
        if builder is None:
            raise DataError(f"cannot read '{file}': supported files are {', '.join(BUILDERS)} (optionally compressed)")
        builders.add(builder)
    if len(builders) > 1:
        raise DataError(f"data.path mixes file kinds ({', '.join(sorted(builders))}); use one kind per dataset")
    return builders.pop()


def _load_local(cfg: DataConfig, hf_cache_dir: Path):
    """(splits, text column, held) where held is (held-out files, all files) for plain text files."""
    import datasets

    kind, files = resolve_local(cfg)
    if kind == "saved":
        loaded = datasets.load_from_disk(cfg.path)
        splits = loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return splits, cfg.text_column, None
    if kind == "folder":
        text_files = _unsplit_text_folder(Path(cfg.path), _data_files(files))
        if text_files is None:  # laid out like a hub dataset: the hub loader infers its splits
            options = {"sample_by": cfg.sample_by} if _all_text(_data_files(files)) else None
            splits = load_hub_dataset(cfg.path, cfg.name, None, cfg.streaming, str(hf_cache_dir), options)
            return splits, "text" if options else cfg.text_column, None
        kind, files = "text", text_files
    # Several text files and no validation split: whole files are held out (see data/validation.py).
    several = kind == "text" and len(files) > 1 and cfg.val_split is None
    held = hold_out_files(files, cfg.val_fraction, cfg.seed) if several else []
    data_files = {"train": [str(f) for f in files if f not in held]}
    if held:
        data_files["validation"] = [str(f) for f in held]
    options = {"sample_by": cfg.sample_by} if kind == "text" else {}
    try:
        splits = datasets.load_dataset(kind, data_files=data_files, streaming=cfg.streaming,
                                       cache_dir=str(hf_cache_dir), **options)
    except datasets.exceptions.DatasetsError as error:
        cause = error.__cause__ or error
        reason = str(cause).splitlines()[0]
        raise DataError(f"cannot read {kind} files from data.path '{cfg.path}': {reason}; fix or remove the bad file") from None
    # The text builder always names its column "text", whatever data.text_column says.
    if kind != "text":
        return splits, cfg.text_column, None
    return splits, "text", (held, files)


def _unsplit_text_folder(root: Path, data_files: List[Path]) -> Optional[List[Path]]:
    """The files of a folder of plain text files with no split layout (they are all training data),
    else None: a folder with train/validation names, a README `configs:` block, or other formats."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    readme = root / "README.md"
    if not _all_text(data_files) or (readme.exists() and "\nconfigs:" in readme.read_text(errors="replace")):
        return None
    patterns = get_data_patterns(str(root))
    if set(patterns) != {"train"}:
        return None
    return sorted(Path(f) for f in DataFilesDict.from_patterns(patterns, base_path=str(root))["train"])


def _data_files(files: List[Path]) -> List[Path]:
    return [f for f in files if f.name not in NOT_DATA]


def _all_text(files: List[Path]) -> bool:
    return bool(files) and all(_builder_of(f) == "text" for f in files)


def _builder_of(file: Path) -> Optional[str]:
    suffixes = [s for s in file.suffixes if s not in COMPRESSIONS]
    return BUILDERS.get(suffixes[-1].lower() if suffixes else "")


def _pick_splits(splits, cfg: DataConfig, where: str):
    """(train, validation, where validation comes from)."""
    names = list(splits.keys())
    if cfg.train_split not in splits:
        raise DataError(f"{where} has no split '{cfg.train_split}' (splits: {', '.join(names)}); set data.train_split")
    if cfg.val_split is not None and cfg.val_split not in splits:
        raise DataError(f"{where} has no split '{cfg.val_split}' (splits: {', '.join(names)}); "
                        "set data.val_split, or null to hold out data.val_fraction")
    val_name = cfg.val_split or ("validation" if "validation" in splits else None)
    if val_name is not None:
        return splits[cfg.train_split], splits[val_name], f"the '{val_name}' split of {where}"
    return hold_out_documents(splits[cfg.train_split], cfg, where)


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
