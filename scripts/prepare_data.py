"""Build (or find) the token cache for a data config, outside of training, and report what it holds.

Usage: python scripts/prepare_data.py [Hydra overrides, as for train.py]
  e.g. python scripts/prepare_data.py data=local data.path='my/*.txt' data.vocab_size=8192
Same configs as train.py (configs/train.yaml), composed with Hydra's compose API: no output dirs.
"""

import os
import sys
import time

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from data import DataConfig, prepare
from training import one_line
from training.cli import ConfigError
from training.program import compose, run


def load_config(overrides):
    """(DataConfig with an absolute cache_dir, trainer.seq_len, model.vocab_size) from the composed config. Only the
    data node is typed: a model config's checks need its classes, hence torch, which preparing data never loads."""
    cfg = compose(overrides)
    try:
        data = OmegaConf.to_object(
            OmegaConf.merge(OmegaConf.structured(DataConfig), OmegaConf.to_container(cfg.data, resolve=True))
        )
        seq_len, vocab_size = cfg.trainer.seq_len, cfg.model.vocab_size
    except OmegaConfBaseException as e:
        raise ConfigError(one_line(e)) from None
    # Relative paths mean "from where the command runs", exactly as in train.py.
    data.cache_dir = os.path.abspath(data.cache_dir)
    return data, seq_len, vocab_size


def report(data, seconds: float) -> str:
    meta = data.meta
    megabytes = (meta["train_bytes"] + meta["val_bytes"]) / 1e6
    lines = [
        f"source      {meta['source']}  ({data.dir})",
        f"tokenizer   {meta['vocab_size']} tokens, {'trained' if meta['tokenizer_trained'] else 'given'}, hash {meta['tokenizer_hash']}",
    ]
    for split in ("train", "val"):
        tokens, size = meta[f"{split}_tokens"], meta[f"{split}_bytes"]
        lines.append(
            f"{split:<11} {tokens:>12,} tokens  {meta[f'{split}_documents']:>9,} documents  "
            f"{size / 1e6:8.2f} MB  {size / max(tokens, 1):.2f} bytes/token"
        )
    built = meta["prepare_seconds"]
    speed = f"{megabytes / built:.2f} MB/s, tokenizer training included"
    if seconds < built / 2:  # answered from the cache
        lines.append(f"time        {seconds:.2f}s (cache hit; built in {built:.2f}s, {speed})")
    else:
        lines.append(f"time        {seconds:.2f}s ({speed})")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in argv):
        print(__doc__)
        return 0
    data_cfg, seq_len, model_vocab_size = load_config(argv)  # a DataError or ConfigError: one error line
    start = time.perf_counter()
    data = prepare(data_cfg, seq_len=seq_len, model_vocab_size=model_vocab_size)
    print(report(data, time.perf_counter() - start))
    return 0


if __name__ == "__main__":
    run(main)
