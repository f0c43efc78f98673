"""CausalLMLoss: the one-shot and chunked cross-entropy against the math, each other, and memory."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from model import ModelConfig, Transformer
from tests.dtype_recorder import MATMULS, OpDtypes
from training.evaluation import IGNORE_INDEX
from training.loop import CHUNK_ABOVE, CausalLMLoss, chunked_cross_entropy

VOCAB = 96


def tiny_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    cfg = dict(vocab_size=VOCAB, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=16)
    return Transformer(ModelConfig(**{**cfg, **overrides}))


def batch(b: int = 3, t: int = 11, ignored: int = 5, seed: int = 1):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, VOCAB, (b, t), generator=gen)
    y = torch.randint(0, VOCAB, (b, t), generator=gen)
    y.view(-1)[torch.randperm(b * t, generator=gen)[:ignored]] = IGNORE_INDEX
    return x, y


def loss_and_grads(model, loss_fn, x, y):
    model.zero_grad(set_to_none=True)
    loss = loss_fn(x, y)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_one_shot_loss_is_the_float64_math():
    model = tiny_model()
    x, y = batch()
    loss = CausalLMLoss(model, chunk_above=None)(x, y)
    with torch.no_grad():
        logits = model(x).double().flatten(0, 1)
    flat = y.flatten()
    keep = flat != IGNORE_INDEX
    expected = (torch.logsumexp(logits[keep], -1) - logits[keep].gather(1, flat[keep, None]).squeeze(1)).mean()
    assert loss.dtype == torch.float32 and loss.dim() == 0
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


@pytest.mark.parametrize("chunk_elements", [7 * VOCAB, 1, 10**9])  # 7 rows (not a divisor of 33), 1 row, all
def test_chunked_loss_and_gradients_equal_the_reference_fp32(chunk_elements):
    model = tiny_model()
    x, y = batch()
    ref_loss, ref_grads = loss_and_grads(model, CausalLMLoss(model, chunk_above=None), x, y)
    chunked = CausalLMLoss(model, chunk_above=0, chunk_elements=chunk_elements)
    assert chunked.chunk_tokens(y.numel(), VOCAB) is not None
    loss, grads = loss_and_grads(model, chunked, x, y)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-6)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_chunked_equals_reference_under_bf16_autocast():
    model = tiny_model(seed=3, tie_embeddings=False)  # an untied head: its gradient is the chunks' sum alone
    x, y = batch(seed=4)
    results = []
    for chunk_above in (None, 0):
        loss_fn = CausalLMLoss(model, chunk_above=chunk_above, chunk_elements=5 * VOCAB)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            results.append(loss_and_grads(model, loss_fn, x, y))
    (ref_loss, ref_grads), (loss, grads) = results
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref_loss, rtol=2e-3, atol=2e-3)
    for name, grad in ref_grads.items():
        assert grads[name].dtype == torch.float32, name  # fp32 master gradients, as with the reference
        # bf16 rounding differs in where partial sums are rounded: compare relative to the gradient's scale.
        assert (grads[name] - grad).abs().max() <= 2e-2 * grad.abs().max() + 1e-6, name


def test_ignored_targets_change_nothing_but_the_denominator():
    model = tiny_model()
    x, y = batch(ignored=0)
    full = CausalLMLoss(model, chunk_above=0, chunk_elements=4 * VOCAB)
    y_masked = y.clone()
    y_masked[:, :4] = IGNORE_INDEX
    per_token = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="none").view(y.shape)
    assert full(x, y_masked).item() == pytest.approx(per_token[:, 4:].mean().item(), rel=1e-5)
    y_masked[:] = IGNORE_INDEX  # nothing to score: NaN, like F.cross_entropy, not a silent 0
    assert math.isnan(full(x, y_masked).item())
    assert math.isnan(CausalLMLoss(model, chunk_above=None)(x, y_masked).item())


class LargestTensor(TorchDispatchMode):
    """Records the largest number of elements any op produced (forward and backward)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("grad", [True, False])
def test_chunked_path_never_materialises_the_full_logits(grad):
    model = tiny_model(vocab_size=1024)  # logits (64 × 1024) dwarf every other tensor of this model
    x, y = batch(b=4, t=16)
    vocab = model.lm_head.weight.shape[0]
    n_logits = y.numel() * vocab
    sizes = {}
    for name, chunk_above in (("one-shot", None), ("chunked", 0)):
        loss_fn = CausalLMLoss(model, chunk_above=chunk_above, chunk_elements=8 * vocab)
        with torch.set_grad_enabled(grad), LargestTensor() as probe:
            loss = loss_fn(x, y)
            if grad:
                loss.backward()
        sizes[name] = probe.largest
    assert sizes["one-shot"] >= n_logits  # the probe sees the logits when they exist
    assert sizes["chunked"] <= max(8 * vocab, model.embed_tokens.weight.numel()) < n_logits


def test_no_grad_path_gives_the_same_loss_and_builds_no_graph():
    model = tiny_model()
    x, y = batch()
    loss_fn = CausalLMLoss(model, chunk_above=0, chunk_elements=4 * VOCAB)
    with torch.no_grad():
        evaluated = loss_fn(x, y)
    assert evaluated.grad_fn is None
    assert evaluated.item() == pytest.approx(CausalLMLoss(model, chunk_above=None)(x, y).item(), rel=1e-6)


def test_threshold_picks_the_path_by_batch_times_vocab():
    loss_fn = CausalLMLoss(tiny_model(), chunk_above=1000, chunk_elements=450)
    assert loss_fn.chunk_tokens(10, 100) is None  # 1000 elements: at the threshold, one shot
    assert loss_fn.chunk_tokens(11, 100) == 4  # above: chunks of chunk_elements // vocab rows
    assert CausalLMLoss(tiny_model(), chunk_above=None).chunk_tokens(10**9, 10**6) is None
    assert CausalLMLoss(tiny_model(), chunk_above=0, chunk_elements=10).chunk_tokens(5, 100) == 1


def test_function_matches_cross_entropy_of_the_product_directly():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(9, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(13, 8, generator=gen, dtype=torch.float64, requires_grad=True)
    targets = torch.tensor([0, 12, IGNORE_INDEX, 5, 5, 3, IGNORE_INDEX, 1, 7])
    torch.autograd.gradcheck(lambda h, w: chunked_cross_entropy(h, w, targets, 4), (hidden, weight))


def test_auto_threshold_keeps_the_cpu_default_one_shot_and_chunks_a_32k_vocab():
    loss_fn = CausalLMLoss(tiny_model())
    assert loss_fn.chunk_above == CHUNK_ABOVE
    assert loss_fn.chunk_tokens(16 * 256, 4096) is None  # the CPU default: 64 MiB of fp32 logits
    assert loss_fn.chunk_tokens(32 * 1024, 32768) == 512  # trainer=gpu: 4 GiB per copy, chunked


# ---- chunked_cross_entropy's dtypes and gradient bookkeeping (mutation testing found them unheld) -------


def _chunk_inputs(n=10, d=8, vocab=4, dtype=torch.float32, seed=5):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, d, generator=gen).to(dtype)
    weight = torch.randn(vocab, d, generator=gen).to(dtype)
    targets = torch.randint(0, vocab, (n,), generator=gen)
    targets[3] = IGNORE_INDEX
    return hidden, weight, targets


def test_chunked_loss_of_bf16_inputs_accumulates_in_fp32_and_returns_bf16_gradients():
    """bf16 hidden and weight (no autocast): the logits are a bf16 matmul, everything after it is fp32 — the
    loss equals the fp32 cross-entropy of those bf16 logits to fp32 precision; gradients keep the inputs'
    dtype. Chunks of 8 rows against a vocabulary of 4: a chunk may hold more rows than the vocabulary."""
    hidden, weight, targets = _chunk_inputs(dtype=torch.bfloat16)
    hidden.requires_grad_(), weight.requires_grad_()
    loss = chunked_cross_entropy(hidden, weight, targets, chunk_tokens=8)
    reference = F.cross_entropy((hidden.detach() @ weight.detach().T).float(), targets, ignore_index=IGNORE_INDEX)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=1e-6, atol=1e-6)
    loss.backward()
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16


def test_chunked_loss_under_autocast_runs_its_matmuls_in_the_autocast_dtype():
    hidden, weight, targets = _chunk_inputs()
    hidden.requires_grad_(), weight.requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16), OpDtypes() as ops:
        chunked_cross_entropy(hidden, weight, targets, chunk_tokens=4)
    matmuls = ops.dtypes_of(MATMULS)
    assert len(matmuls) == 3 * 3  # 3 chunks × (logits, grad of hidden, grad of weight)
    assert all(set(dtypes) == {torch.bfloat16} for dtypes in matmuls), matmuls


def test_chunked_loss_computes_gradients_exactly_when_they_are_needed():
    hidden, weight, targets = _chunk_inputs()
    hidden.requires_grad_(), weight.requires_grad_()
    with torch.no_grad(), OpDtypes() as ops:  # evaluation: one matmul per chunk, no gradient work
        chunked_cross_entropy(hidden, weight, targets, chunk_tokens=4)
    assert len(ops.dtypes_of(MATMULS)) == 3
    frozen = weight.detach()  # a frozen head: the hidden states still need their gradient
    hidden.grad = None
    chunked_cross_entropy(hidden, frozen, targets, chunk_tokens=4).backward()
    expected = hidden.detach().clone().requires_grad_()
    F.cross_entropy(expected @ frozen.T, targets, ignore_index=IGNORE_INDEX).backward()
    torch.testing.assert_close(hidden.grad, expected.grad)


def test_chunked_loss_in_float64_is_the_float64_math():
    """Accumulation at least fp32 means fp64 inputs accumulate in fp64: loss and both gradients equal
    F.cross_entropy's in float64 to 1e-12 (an fp32 accumulator or row weight would miss by ~1e-8)."""
    hidden, weight, targets = _chunk_inputs(n=10, dtype=torch.float64)  # 9 scored rows: 1/9 is inexact in fp32
    ours = [t.clone().requires_grad_() for t in (hidden, weight)]
    ref = [t.clone().requires_grad_() for t in (hidden, weight)]
    loss = chunked_cross_entropy(*ours, targets, chunk_tokens=4)
    expected = F.cross_entropy(ref[0] @ ref[1].T, targets, ignore_index=IGNORE_INDEX)
    loss.backward(), expected.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=1e-12)
    for a, b in zip(ours, ref):
        assert a.grad.dtype == torch.float64
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("setting, chunk_above", [("auto", CHUNK_ABOVE), ("true", 0), ("false", None)])
def test_trainer_chunked_loss_reaches_the_loss_train_py_builds(setting, chunk_above):
    """trainer.chunked_loss through training/loop.py's build: true always chunks, false never, auto above 2^26 logits."""
    from training.distributed import DistInfo
    from training.loop import build
    from training.program import compose_train_config

    cfg, _ = compose_train_config(["debug=tiny", f"trainer.chunked_loss={setting}"])
    loss_module = build(cfg, DistInfo(), say=lambda *a: None).loss_module
    assert isinstance(loss_module, CausalLMLoss) and loss_module.chunk_above == chunk_above
