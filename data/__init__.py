"""minillama's data pipeline: a public text dataset in, batches of token ids out."""
from data.config import DataConfig
from data.errors import DataError
from data.loader import SAMPLERS, EpochBatches, TrainBatches, eval_windows, windows_per_epoch
from data.preparation import PreparedData, prepare
from data.tokenizer import SPECIAL_TOKENS, load_tokenizer

__all__ = ["DataConfig", "DataError", "prepare", "PreparedData", "load_tokenizer", "TrainBatches",
           "EpochBatches", "SAMPLERS", "windows_per_epoch", "eval_windows", "SPECIAL_TOKENS"]
