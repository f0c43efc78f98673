"""Evaluation: the loss is the plain mean cross-entropy over the windows; bits per byte follows it."""
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, Transformer
from training.distributed import DistInfo
from training.evaluation import evaluate
from training.precision import autocast_context


def test_loss_perplexity_and_bits_per_byte_match_a_direct_computation():
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16))
    windows = torch.randint(0, 50, (5, 17))  # 5 windows: the last micro-batch is a partial one
    cfg = SimpleNamespace(trainer=SimpleNamespace(micro_batch_size=2, activation_rms=True))
    meta = {"val_tokens": 1000, "val_bytes": 3500}
    out = evaluate(model, model, windows, cfg, autocast_context("fp32", torch.device("cpu")), meta, DistInfo())
    with torch.no_grad():
        logits = model(windows[:, :-1])
    expected = F.cross_entropy(logits.reshape(-1, 50), windows[:, 1:].reshape(-1)).item()
    assert out["val_loss"] == pytest.approx(expected, rel=1e-6)
    assert out["val_ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
    # nats/token → bits/token (÷ ln 2) → bits/byte (× tokens/byte)
    assert out["val_bpb"] == pytest.approx(expected / math.log(2) * 1000 / 3500, rel=1e-6)
    assert len(out["act_rms"]["residual"]) == 2
    assert model.training  # evaluate puts the model back into training mode
