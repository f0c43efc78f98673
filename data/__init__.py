"""minillama's data: a public text dataset in (sources.py), a byte-level BPE (tokenizer.py), a verified token cache
(cache.py), batches of token ids out (loader.py)."""

from data.cache import PreparedData, prepare
from data.loader import SAMPLERS, EpochBatches, TrainBatches, eval_windows, windows_per_epoch
from data.sources import DataConfig, DataError, SourceGone
from data.tokenizer import SPECIAL_TOKENS, load_tokenizer

__all__ = [
    "DataConfig",
    "DataError",
    "EpochBatches",
    "PreparedData",
    "SAMPLERS",
    "SPECIAL_TOKENS",
    "SourceGone",
    "TrainBatches",
    "eval_windows",
    "load_tokenizer",
    "prepare",
    "windows_per_epoch",
]
