"""DataConfig: where the text comes from, how it is tokenized, and where the token cache lives."""
from dataclasses import dataclass, field
from typing import List, Optional

from data.loader import SAMPLERS

SOURCES = ("shakespeare", "hub", "tinystories", "fineweb_edu", "local")


@dataclass
class DataConfig:
    # Which loader builds the documents: shakespeare | hub (any Hugging Face hub dataset: data.path is its
    # id) | tinystories | fineweb_edu (two hub datasets with their ids built in) | local.
    source: str = "shakespeare"
    # Hub dataset id (hub sources) or, for `local`, a file, a glob, a directory of files laid out
    # like a hub dataset, or a directory written by `Dataset.save_to_disk`.
    path: Optional[str] = None
    # More files or globs: for `local` they are added to `path`; for hub sources they restrict
    # which of the repository's files are read (passed to `load_dataset(data_files=...)`).
    data_files: List[str] = field(default_factory=list)
    name: Optional[str] = None  # hub config name, e.g. "sample-10BT"
    text_column: str = "text"
    # Plain-text files only: one document per "paragraph" (blank-line separated), "document"
    # (whole file) or "line". Each document ends with EOS, so this decides where text "ends".
    sample_by: str = "paragraph"
    train_split: str = "train"
    # The source's own validation split: None means "validation" when the source has one;
    # otherwise a deterministic held-out fraction of documents becomes validation.
    val_split: Optional[str] = None
    val_fraction: float = 0.05
    # Streaming sources stop after this many training tokens (None = whole split).
    streaming: bool = False
    token_budget: Optional[int] = None
    val_token_budget: Optional[int] = None
    # Tokenizer: train a byte-level BPE of this size, or use an existing tokenizer.json.
    vocab_size: int = 4096
    tokenizer_path: Optional[str] = None
    # BPE is trained on at most this many UTF-8 bytes from the start of the training split:
    # merges stop changing long before a multi-GB corpus is exhausted.
    tokenizer_train_bytes: Optional[int] = 100_000_000
    cache_dir: str = "data_cache"
    # 1 is fastest for most corpora: `encode_batch` already uses every core from Rust, and
    # forked map workers lose that (tokenizers turns its threads off after a fork).
    num_proc: int = 1
    seed: int = 1234
    # How training windows are drawn: random (with replacement; one epoch's worth of tokens leaves ~37 % of
    # windows undrawn) or epochs (every window once per epoch, a new offset and order each epoch). Not part of
    # the token cache: the same tokens, read in another order. epochs by default: on paired seeds it reached a
    # lower validation bpb at equal steps (BENCHMARKS.md, "Drawing windows"); the study presets pin random.
    sampling: str = "epochs"

    def __post_init__(self):
        if self.sampling not in SAMPLERS:
            raise ValueError(f"data.sampling={self.sampling!r} is unknown; choose one of {', '.join(SAMPLERS)}")
