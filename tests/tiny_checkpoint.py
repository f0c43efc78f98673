"""A tiny byte-level BPE tokenizer, random Transformer and checkpoint directory for generation/interop tests."""

from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from model import ModelConfig, Transformer
from tests.model_helpers import one_thread
from training.checkpoint import save_checkpoint, tokenizer_files

REPO = Path(__file__).resolve().parents[1]

SPECIALS = ["<|bos|>", "<|eos|>", "<|pad|>"]  # ids 0, 1, 2, as minillama's data pipeline trains them
CORPUS = [
    "ROMEO: But, soft! what light through yonder window breaks?",
    "JULIET: O Romeo, Romeo! wherefore art thou Romeo?",
    "héllo wörld — naïve café, 日本語, emoji 😀 and tabs\tand\nnewlines",
] * 20


@pytest.fixture(autouse=True)
def single_thread():
    """Import into a test module to run its tiny models on one thread (see tests/model_helpers.py)."""
    with one_thread():
        yield


def tiny_tokenizer(vocab_size: int = 300) -> Tokenizer:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIALS,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return tokenizer


def tiny_config(vocab_size: int, **overrides) -> ModelConfig:
    fields = dict(
        vocab_size=vocab_size, hidden_size=64, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=64
    )
    return ModelConfig(**{**fields, **overrides})


def random_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """Random weights, with norm weights perturbed too so a wrong norm mapping cannot hide behind ones."""
    torch.manual_seed(seed)
    model = Transformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def write_checkpoint(root: Path, model: Transformer, tokenizer: Tokenizer) -> Path:
    """A checkpoint directory, written by the same function train.py uses."""
    root.mkdir(parents=True, exist_ok=True)
    tokenizer_path = root / "tokenizer_src.json"
    tokenizer.save(str(tokenizer_path))
    return save_checkpoint(
        root / "checkpoints",
        10,
        model.state_dict(),
        model.cfg,
        tokenizer_files(tokenizer_path),
        state={"step": 10},
        config_yaml="",
    )
