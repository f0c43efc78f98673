"""Evaluation in the loop (training/evaluation.py `evaluate`): the loss is the plain mean cross-entropy over the
scored targets; bits per byte follows it; with eval_windows=all it is every token of the split, once."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, Transformer
from training.distributed import DistInfo
from training.evaluation import Windows, evaluate, full_split_windows
from training.loop import CausalLMLoss, autocast_context

FP32 = autocast_context("fp32", torch.device("cpu"))


def tiny():
    torch.manual_seed(0)
    return Transformer(ModelConfig(vocab_size=50, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16))


def test_tiles_loss_perplexity_and_bits_per_byte_match_a_direct_computation():
    model = tiny()
    windows = torch.randint(0, 50, (5, 17))  # 5 windows: the last micro-batch is a partial one
    meta = {"val_tokens": 1000, "val_bytes": 3500}
    out = evaluate(CausalLMLoss(model), Windows.from_tiles(windows), 2, FP32, meta, DistInfo())
    with torch.no_grad():
        logits = model(windows[:, :-1])
    expected = F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].reshape(-1)).item()
    assert out["val_loss"] == pytest.approx(expected, rel=1e-6)
    assert out["val_ppl"] == pytest.approx(math.exp(expected), rel=1e-6)
    # nats/token → bits/token (÷ ln 2) → bits/byte (× tokens/byte)
    assert out["val_bpb"] == pytest.approx(expected / math.log(2) * 1000 / 3500, rel=1e-6)
    assert model.training  # evaluate puts the model back into training mode


def test_all_windows_score_every_token_and_bpb_is_total_bits_over_bytes():
    model, eos = tiny(), 1
    tokens = np.random.default_rng(0).integers(0, 50, size=70)  # 5 windows of 16, the last ragged
    meta = {"val_tokens": 70, "val_bytes": 250}
    windows = full_split_windows(tokens, 16, eos)
    out = evaluate(CausalLMLoss(model), windows, 2, FP32, meta, DistInfo())
    stream = torch.tensor([eos, *tokens.tolist()])
    with torch.no_grad():  # the same tiling by hand: inputs stream[16k : 16k+16], targets one later
        nats = sum(
            F.cross_entropy(model(stream[s : min(s + 16, 70)][None])[0], stream[s + 1 : s + 17], reduction="sum").item()
            for s in range(0, 70, 16)
        )
    assert out["val_loss"] == pytest.approx(nats / 70, rel=1e-5)
    assert out["val_bpb"] == pytest.approx(nats / math.log(2) / 250, rel=1e-5)


def test_padding_rows_of_a_rank_share_score_nothing():
    """Rank 1 of 2 over 3 windows holds one real window and one padding row; its loss is that window's."""
    model, eos = tiny(), 1
    tokens = np.random.default_rng(1).integers(0, 50, size=40)  # 3 windows of 16
    share = full_split_windows(tokens, 16, eos, rank=1, world_size=2)
    assert len(share) == 2
    out = evaluate(CausalLMLoss(model), share, 1, FP32, {"val_tokens": 1, "val_bytes": 1}, DistInfo())
    with torch.no_grad():
        expected = F.cross_entropy(model(share.inputs[:1])[0], share.targets[0]).item()
    assert out["val_loss"] == pytest.approx(expected, rel=1e-6) and math.isfinite(out["val_loss"])


def test_evaluation_runs_every_module_in_eval_mode_and_gives_one_number_with_dropout_on():
    """With dropout 0.5 everywhere it applies, evaluation scores with every module in eval mode (no dropout: the
    same number twice, the same as the model in eval mode by hand) and hands the model back in training mode; left in
    train mode, validation would be noise and `best` and early stopping would be decided on it (issue 68)."""
    torch.manual_seed(0)
    model = Transformer(ModelConfig(vocab_size=50, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16, dropout=0.5))
    loss, seen = CausalLMLoss(model).train(), set()
    hooks = [m.register_forward_pre_hook(lambda m, args: seen.add(m.training)) for m in loss.modules()]
    windows, meta = torch.randint(0, 50, (4, 17)), {"val_tokens": 100, "val_bytes": 300}
    first, second = (
        evaluate(loss, Windows.from_tiles(windows), 2, FP32, meta, DistInfo())["val_loss"] for _ in range(2)
    )
    for hook in hooks:
        hook.remove()
    assert seen == {False} and first == second
    assert all(m.training for m in loss.modules())
    with torch.no_grad():
        by_hand = loss.eval()(windows[:, :-1], windows[:, 1:]).item()
    assert first == pytest.approx(by_hand, rel=1e-6)
