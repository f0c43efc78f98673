"""Sampling (model/generate.py): temperature, top-k and top-p filters and the draw itself, against their
definitions and torch.multinomial, on one distribution or any batch shape. The decode loop is test_generate.py."""

import pytest
import torch

from model.generate import sample_next, top_k_filter, top_p_filter


@pytest.mark.parametrize("temperature", [None, 0.5, 2.0])
def test_sample_next_draws_from_the_softmax_of_logits_over_temperature(temperature):
    """The reference, draw for draw: torch.multinomial on softmax(logits / T), T = 1 by default."""
    logits = torch.randn(64, 9, generator=torch.Generator().manual_seed(0))
    kwargs = {} if temperature is None else {"temperature": temperature}
    ours = sample_next(logits, generator=torch.Generator().manual_seed(1), **kwargs)
    reference = torch.multinomial(
        (logits / (temperature or 1.0)).softmax(-1), 1, generator=torch.Generator().manual_seed(1)
    )[:, 0]
    assert torch.equal(ours, reference)
    assert not torch.equal(ours, sample_next(logits, 3.0, generator=torch.Generator().manual_seed(1)))


def test_filters_and_sampling_work_on_one_distribution_and_on_any_batch_shape():
    """(V,) or (..., V): the vocabulary is always the last dimension."""
    logits = torch.randn(2, 3, 20, generator=torch.Generator().manual_seed(0))
    flat = logits.reshape(6, 20)
    assert torch.equal(top_k_filter(logits, 4).reshape(6, 20), top_k_filter(flat, 4))
    assert torch.equal(top_p_filter(logits, 0.7).reshape(6, 20), top_p_filter(flat, 0.7))
    assert torch.equal(top_k_filter(flat[2], 4), top_k_filter(flat, 4)[2])
    assert torch.equal(top_p_filter(flat[2], 0.7), top_p_filter(flat, 0.7)[2])
    assert sample_next(flat[2], temperature=0).item() == flat[2].argmax().item()
    one = sample_next(flat[2], top_k=1, generator=torch.Generator().manual_seed(0))
    assert one.shape == () and one.item() == flat[2].argmax().item()


def test_top_p_edges_ties_and_a_negligible_tail():
    # Two equally likely tokens, p = 0.5: the first one already reaches p, so it alone is kept.
    assert top_p_filter(torch.zeros(1, 2), 0.5).isfinite().tolist() == [[True, False]]
    # p = 1 keeps everything, even a token whose probability (e^-40) vanishes next to fp32's 1.0.
    logits = torch.tensor([[0.0, -40.0, 1.0]])
    assert torch.equal(top_p_filter(logits, 1.0), logits)
    assert torch.equal(top_k_filter(logits, 3), logits)


def test_top_k_keeps_exactly_the_k_largest():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    kept = top_k_filter(logits, 7).isfinite()
    assert kept.sum(-1).tolist() == [7, 7, 7]
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(7).indices, True))


def test_top_p_keeps_the_minimal_nucleus():
    probs = torch.tensor([[0.05, 0.5, 0.15, 0.3]])
    kept = lambda p: top_p_filter(probs.log(), p).isfinite()[0].tolist()  # noqa: E731
    assert kept(0.4) == [False, True, False, False]  # the top token alone reaches 0.4
    assert kept(0.75) == [False, True, False, True]  # 0.5 + 0.3
    assert kept(0.9) == [False, True, True, True]
    assert kept(1.0) == [True] * 4
    logits = torch.randn(200, 64, generator=torch.Generator().manual_seed(1))
    for p in (0.1, 0.5, 0.9):
        keep = top_p_filter(logits, p).isfinite()
        probs, order = logits.softmax(-1).sort(-1, descending=True)
        kept_sorted = keep.gather(-1, order)
        n = kept_sorted.sum(-1)
        assert torch.equal(kept_sorted, torch.arange(64)[None] < n[:, None])  # a prefix of the ranking
        mass = probs.cumsum(-1).gather(-1, (n - 1)[:, None])[:, 0]
        assert (mass >= p - 1e-6).all() and (mass - probs.gather(-1, (n - 1)[:, None])[:, 0] < p).all()


def test_sample_next_only_draws_from_the_filtered_set():
    logits = torch.randn(4, 30, generator=torch.Generator().manual_seed(2)).repeat(50, 1)
    draws = sample_next(logits, temperature=2.0, top_k=3, generator=torch.Generator().manual_seed(0))
    allowed = logits.topk(3).indices
    assert (draws[:, None] == allowed).any(-1).all()
    assert len(set(draws[0::4].tolist())) > 1  # and it is really sampling among them
