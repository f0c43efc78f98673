"""Shared bits for the model tests: a tiny GQA config, weights that are not at their init, one CPU thread."""
import contextlib
from typing import Iterator

import torch

from model import ModelConfig, Transformer


def tiny_model_config(**overrides) -> ModelConfig:
    """2 layers, dim 32, 4 query heads sharing 2 kv heads: small enough for milliseconds, GQA on purpose."""
    fields = dict(vocab_size=61, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16,
                  max_seq_len=24)
    return ModelConfig(**{**fields, **overrides})


def random_transformer(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Init weights plus noise on every parameter, norm weights included, so a swapped or ignored
    parameter cannot hide behind ones, zeros or the tiny residual init."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread; with other jobs on the two cores, OpenMP's spinning
    threads make them 10× slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
