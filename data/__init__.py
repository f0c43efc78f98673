"""minillama's data: a public text dataset in (sources.py), a byte-level BPE (tokenizer.py), a verified token cache
(cache.py), batches of token ids out (loader.py)."""

# The package's API: `from data import prepare`.
from data.cache import PreparedData, prepare  # noqa: F401
from data.loader import SAMPLERS, EpochBatches, TrainBatches, eval_windows, windows_per_epoch  # noqa: F401
from data.sources import DataConfig, DataError, SourceGone  # noqa: F401
from data.tokenizer import SPECIAL_TOKENS, load_tokenizer  # noqa: F401
