"""Helpers for the data tests: synthetic documents, files in each local format, hub-like folders."""

import json
import random
from pathlib import Path

import numpy as np

QUIET = dict(log=lambda message: None)
REPO = Path(__file__).resolve().parents[1]


def make_documents(count: int, seed: int = 0) -> list:
    """Distinct English-like documents with some non-ASCII, rich enough for a few hundred BPE merges."""
    rng = random.Random(seed)
    words = (
        "the of and to in is was that for with his they at be this from have or by one had not but what "
        "all were when we there can an your which their said if do will each about how up out them then "
        "she many some so these would other into has more her two like him see time could no make than "
        "first been its who now people my made over did down only way find use may water long little very "
        "after words called just where most know café naïve über 東京 ☃"
    ).split()
    return [
        f"Document {i}. " + " ".join(rng.choice(words) for _ in range(rng.randint(20, 80))) + "." for i in range(count)
    ]


def split_documents(prepared, split: str) -> list:
    """The documents behind a token file: decode the ids between EOS tokens."""
    tokens = np.asarray(prepared.train_tokens() if split == "train" else prepared.val_tokens())
    ends = np.flatnonzero(tokens == prepared.meta["eos_id"])
    starts = np.concatenate([[0], ends[:-1] + 1])
    tokenizer = prepared.tokenizer()
    return [tokenizer.decode(tokens[s:e].tolist()) for s, e in zip(starts, ends)]


def write_local(folder: Path, documents: list, kind: str, column: str = "text") -> str:
    """Write `documents` as a `kind` file (txt, jsonl, parquet, csv) and return its path as a string."""
    import pandas as pd

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"corpus.{kind}"
    if kind == "txt":  # one document per paragraph, the text files' default
        # No final newline: datasets' paragraph reader keeps it on the last paragraph.
        path.write_text("\n\n".join(documents), encoding="utf-8")
    elif kind == "jsonl":
        path.write_text(
            "".join(json.dumps({column: d, "id": i}) + "\n" for i, d in enumerate(documents)), encoding="utf-8"
        )
    elif kind == "parquet":
        pd.DataFrame({column: documents, "id": range(len(documents))}).to_parquet(path)
    elif kind == "csv":
        pd.DataFrame({column: documents, "id": range(len(documents))}).to_csv(path, index=False)
    return str(path)


def tinystories_layout(root: Path, train: list, validation: list) -> str:
    """A folder laid out like roneneldan/TinyStories on the hub: data/<split>-00000-of-00001.parquet."""
    import pandas as pd

    (root / "data").mkdir(parents=True, exist_ok=True)
    pd.DataFrame({"text": train}).to_parquet(root / "data" / "train-00000-of-00001.parquet")
    pd.DataFrame({"text": validation}).to_parquet(root / "data" / "validation-00000-of-00001.parquet")
    return str(root)


def fineweb_layout(root: Path, documents: list, shards: int = 2) -> str:
    """A folder laid out like HuggingFaceFW/fineweb-edu: sample/10BT/*.parquet, and the README's
    `configs:` block that maps the config name sample-10BT to those files, as on the hub."""
    import pandas as pd

    folder = root / "sample" / "10BT"
    folder.mkdir(parents=True, exist_ok=True)
    for shard, part in enumerate(np.array_split(np.arange(len(documents)), shards)):
        frame = pd.DataFrame(
            {"text": [documents[i] for i in part], "id": [f"<urn:{i}>" for i in part], "score": [3.5] * len(part)}
        )
        frame.to_parquet(folder / f"{shard:03d}_00000.parquet")
    (root / "README.md").write_text(
        "---\nconfigs:\n- config_name: sample-10BT\n  data_files:\n"
        "  - split: train\n    path: sample/10BT/*\n---\n# fineweb-edu (test copy)\n"
    )
    return str(root)


def cache_entries(cache_dir: Path) -> list:
    """Names in the cache folder other than the builders' lock file (where
    concurrent builders meet; a kill -9 mid-build can leave it, and it never looks like a cache)."""
    ignored = (".prepare.lock",)
    return (
        sorted(p.name for p in Path(cache_dir).iterdir() if p.name not in ignored) if Path(cache_dir).exists() else []
    )
