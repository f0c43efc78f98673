"""Scoring windows predict every token exactly once, and the summed loss equals a float64 hand computation."""

import contextlib
import math

import numpy as np
import pytest
import torch

from tests.model_helpers import one_thread, random_transformer, tiny_model_config
from training.evaluation import (
    IGNORE_INDEX,
    Score,
    Windows,
    full_split_windows,
    gather,
    score,
    scoring_stream,
    split_windows,
    window_plan,
)
from training.loop import CausalLMLoss

EOS = 1


@pytest.fixture(autouse=True)
def single_thread():
    with one_thread():
        yield


def scored_positions(tokens_len, context, stride):
    """Every (window, position) the plan predicts, from the gathered targets: position = start + column + 1."""
    plan = window_plan(tokens_len, context, stride)
    windows = gather(np.arange(tokens_len + 1), plan, np.arange(len(plan)))  # stream value = its position
    return plan, windows, windows.targets[windows.targets != IGNORE_INDEX].tolist()


@pytest.mark.parametrize("length", [1, 5, 7, 8, 9, 33, 100])
@pytest.mark.parametrize("context, stride", [(8, 8), (8, 3), (8, 1), (1, 1), (16, 16), (16, 5)])
def test_every_token_is_predicted_exactly_once_with_its_window_context(length, context, stride):
    plan, windows, positions = scored_positions(length, context, stride)
    assert sorted(positions) == list(range(1, length + 1))  # once each: no gap, no double count
    contexts = []
    for row in range(len(plan)):
        inputs, targets = windows.inputs[row], windows.targets[row]
        for col in torch.nonzero(targets != IGNORE_INDEX).flatten().tolist():
            assert targets[col] == inputs[col] + 1  # the target is the token right after its inputs
            context_len = col + 1  # inputs 0..col (causal); the window starts at plan.starts[row]
            if row > 0:  # after the first window: at least T - S + 1 tokens of context
                assert context_len >= context - stride + 1
            contexts.append(context_len)
    assert windows.inputs.shape[1] == min(context, length)
    if stride == context < length:  # tiled: each window's first prediction sees one token
        assert contexts.count(1) == len(plan)


def test_stride_equal_to_context_is_the_non_overlapping_tiling():
    a, b = window_plan(100, 8, 8), window_plan(100, 8, None)
    assert all(np.array_equal(x, y) for x, y in ((a.starts, b.starts), (a.first, b.first), (a.ends, b.ends)))
    assert list(a.starts[:3]) == [0, 8, 16] and len(a) == 13  # ceil(100 / 8)


@pytest.mark.parametrize("stride, context", [(0, 8), (9, 8), (1, 0)])
def test_bad_stride_is_refused(stride, context):
    with pytest.raises(ValueError, match="need 1 <= stride <= context"):
        window_plan(10, context, stride)


def hand_nats(model, tokens, context, stride):
    """Σ -log p in float64, one forward per token over exactly the context its window gives it."""
    model64 = random_transformer(model.cfg).double()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    stream = [EOS] + list(tokens)
    total = 0.0
    for j in range(1, len(stream)):  # the stream's positions 1..L are the targets
        window = max(0, math.ceil((j - context) / stride))  # first window whose inputs reach j - 1
        start = window * stride
        with torch.no_grad():
            logits = model64(torch.tensor([stream[start:j]]))[0, -1]
        total -= torch.log_softmax(logits, dim=-1)[stream[j]].item()
    return total


@pytest.mark.parametrize("stride", [None, 3])
def test_score_equals_a_float64_hand_computation(stride):
    model = random_transformer(tiny_model_config(max_seq_len=8))
    tokens = np.random.default_rng(0).integers(0, model.cfg.vocab_size, size=29)  # 4 windows, a ragged tail
    nats, scored = score(
        CausalLMLoss(model), split_windows(tokens, EOS, 8, stride), 3, torch.device("cpu"), contextlib.nullcontext
    )
    assert scored.item() == 29
    assert nats.item() == pytest.approx(hand_nats(model, tokens, 8, stride or 8), rel=1e-5)


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_full_split_windows_cover_the_split_once_across_ranks(world_size):
    tokens = np.arange(2, 2 + 45)  # 45 tokens, context 8: 6 windows, the last ragged
    shares = [full_split_windows(tokens, 8, EOS, rank=r, world_size=world_size) for r in range(world_size)]
    assert len({len(s) for s in shares}) == 1  # every rank runs the same number of forwards
    targets = sorted(t for s in shares for t in s.targets[s.targets != IGNORE_INDEX].tolist())
    assert targets == tokens.tolist()  # every token once, the first one and the tail included
    assert shares[0].inputs[0, 0] == EOS  # the first token is predicted from an EOS, as a document start


def test_score_properties():
    s = Score(nats=100.0, tokens=50, bytes=200)
    assert s.loss == 2.0 and s.perplexity == pytest.approx(math.exp(2.0))
    assert s.bits_per_byte == pytest.approx(100 / math.log(2) / 200)


def test_scoring_stream_prepends_one_eos():
    assert scoring_stream(np.array([5, 6], dtype=np.uint16), EOS).tolist() == [EOS, 5, 6]


# ---- the edges mutation testing found unheld (docs/testing.md, mutation scores) -------------------------


def test_window_plan_edges_and_its_messages():
    with pytest.raises(ValueError) as e:
        window_plan(0, 8)
    assert str(e.value) == "nothing to score: the text has no tokens"
    short = window_plan(5, 8)  # shorter than the context: one window, however the stride
    assert len(short) == 1 and short.width == 5
    plan = window_plan(8 + 5, 8, 2)  # 5 targets past the first window, stride 2: ceil(5 / 2) = 3 more
    assert len(plan) == 4 and plan.starts.dtype == np.int64 and plan.starts.tolist() == [0, 2, 4, 6]


def num_scored(windows: Windows) -> int:
    return int((windows.targets != IGNORE_INDEX).sum())


def test_full_split_windows_keeps_the_stride_checks_the_rank_and_pads_with_a_real_row():
    tokens = np.arange(2, 40, dtype=np.uint16)  # 38 tokens
    strided = full_split_windows(tokens, 8, EOS, stride=4)
    assert len(strided) == len(window_plan(len(tokens), 8, 4)) > len(full_split_windows(tokens, 8, EOS))
    assert num_scored(strided) == len(tokens)
    with pytest.raises(ValueError) as e:
        full_split_windows(tokens, 8, EOS, rank=2, world_size=2)
    assert str(e.value) == "need 0 <= rank < world_size, got rank=2, world_size=2"
    # 5 windows over 3 ranks: ranks 0 and 1 hold 2, rank 2 holds 1 and one padding row scoring nothing.
    plan_len = len(window_plan(len(tokens), 8))
    assert plan_len == 5
    last = full_split_windows(tokens, 8, EOS, rank=2, world_size=3)
    assert len(last) == 2 and num_scored(last) == 8  # window 2 of 5 scores a full context
    assert torch.equal(last.inputs[1], last.inputs[0]) and (last.targets[1] == IGNORE_INDEX).all()
    shares = [full_split_windows(tokens, 8, EOS, rank=r, world_size=2) for r in range(2)]
    assert [len(s) for s in shares] == [3, 3] and sum(num_scored(s) for s in shares) == len(tokens)
    assert torch.equal(shares[1].inputs[2], shares[1].inputs[0])  # the first row, not the second


def test_score_reports_every_batch():
    model = random_transformer(tiny_model_config(vocab_size=64))
    tokens = np.arange(2, 60, dtype=np.uint16)
    counts = []
    nats, scored = score(
        CausalLMLoss(model),
        split_windows(tokens, EOS, 16),
        2,
        torch.device("cpu"),
        contextlib.nullcontext,
        on_batch=counts.append,
    )
    assert scored.item() == len(tokens) and sum(counts) == len(tokens) and len(counts) == 2 and nats.item() > 0
