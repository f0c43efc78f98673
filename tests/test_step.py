"""training/step.py: a non-finite step never reaches weights or optimizer state; the record counts streaks."""

import contextlib
import copy
from pathlib import Path

import pytest
import torch

from tests.dtype_recorder import ATTENTION, MATMULS, SOFTMAX_LOSS
from training.loop import NonFiniteGuard, NonFiniteLoss, TrainStep, global_grad_norm


def tiny_regression():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def optimizer_of(kind: str, model):
    from training.optim import Muon

    if kind == "muon":
        return Muon(
            [model[0].weight, model[2].weight],
            ns_dtype=torch.float32,
            lr=0.05,
            weight_decay=0.1,
            adjust_lr_fn="match_rms_adamw",
        )
    return torch.optim.AdamW(
        model.parameters(), lr=0.1, fused=kind == "fused", foreach=None if kind == "fused" else False
    )


@pytest.mark.parametrize("kind", ["fused", "plain", "muon"])
def test_a_nonfinite_step_leaves_weights_and_optimizer_state_untouched(kind):
    """The host reads the step's finite flag (free on a CPU, a sync on a GPU) and a bad step never calls
    optimizer.step(): weights, AdamW's moments and step count, Muon's momentum stay; a good step afterwards trains."""
    model = tiny_regression()
    opt = optimizer_of(kind, model)
    x, y = torch.randn(1, 3, 4), torch.randn(1, 3, 1)
    poison = {"on": False}
    loss_fn = lambda a, b: (model(a) - b).pow(2).mean() * (float("nan") if poison["on"] else 1.0)  # noqa: E731
    step = TrainStep(loss_fn, _Batches(x, y), [opt], contextlib.nullcontext, 1, 1.0, torch.device("cpu"))
    step(0)  # one real step: moments exist
    before_w, before_state = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    poison["on"] = True
    step(1)
    assert step.guard.read()["skipped"] == 1
    for k, v in model.state_dict().items():
        assert torch.equal(v, before_w[k]), k
    for pid, state in opt.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(value, before_state["state"][pid][key]), (pid, key)
    assert all(p.grad is None for g in opt.param_groups for p in g["params"])  # zeroed either way
    poison["on"] = False
    step(2)  # and a good step afterwards still trains
    assert not torch.equal(model.state_dict()["0.weight"], before_w["0.weight"])
    if kind != "muon":
        assert int(next(iter(opt.state_dict()["state"].values()))["step"]) == 2


def test_the_step_commits_nothing_when_the_loss_is_finite_but_a_gradient_is_not():
    """The guard's gradient half (issue: a finite loss with one inf gradient must not reach the weights)."""
    model = tiny_regression()
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)

    class InfGradient(torch.autograd.Function):  # finite forward, an inf gradient in backward
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad * float("inf")

    def loss_fn(x, y):
        return (InfGradient.apply(model(x)) - y).pow(2).mean()

    before = copy.deepcopy(model.state_dict())
    step = TrainStep(
        loss_fn,
        _Batches(torch.randn(1, 3, 4), torch.randn(1, 3, 1)),
        [opt],
        contextlib.nullcontext,
        1,
        1.0,
        torch.device("cpu"),
    )
    loss, grad_norm = step(0)
    assert torch.isfinite(loss) and not torch.isfinite(grad_norm)
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert step.guard.read() == {"skipped": 1, "streak": 1, "max_streak": 1, "first_bad": 1}


def test_record_counts_streaks_across_reads_and_resets_the_interval():
    rec = NonFiniteGuard(torch.device("cpu"))
    assert rec.read() == {"skipped": 0, "streak": 0, "max_streak": 0, "first_bad": -1}  # -1: no bad step yet
    pattern = [True, False, False, True, False]  # steps 1..5: finite?
    for step, ok in enumerate(pattern[:3], start=1):
        rec.update(torch.tensor(ok), step)
    assert rec.read() == {"skipped": 2, "streak": 2, "max_streak": 2, "first_bad": 2}
    for step, ok in enumerate(pattern[3:], start=4):
        rec.update(torch.tensor(ok), step)
    # the interval starts from the carried streak (2); step 4 was fine, so the streak restarted at 5
    assert rec.read() == {"skipped": 1, "streak": 1, "max_streak": 2, "first_bad": 5}
    assert rec.read() == {"skipped": 0, "streak": 1, "max_streak": 1, "first_bad": -1}


def test_global_grad_norm_is_the_norm_of_all_gradients_in_float64():
    model = tiny_regression()
    model(torch.randn(5, 4)).pow(2).sum().backward()
    params = list(model.parameters())
    expected = torch.cat([p.grad.double().flatten() for p in params]).norm()
    assert global_grad_norm(params).item() == pytest.approx(expected.item(), rel=1e-6)


def first_step(step: TrainStep) -> tuple:
    """(mean loss, grad norm) of optimizer step 0."""
    return step(0)


class _Batches:
    def __init__(self, xs, ys):
        self.xs, self.ys = xs, ys

    def get(self, step, micro):
        return self.xs[micro], self.ys[micro]


def test_train_step_accumulates_micro_batches_like_one_big_batch_and_clips():
    """k micro-batches of b, each loss divided by k, give the gradient of one batch of k·b (mean loss)."""
    torch.manual_seed(1)
    xs, ys = torch.randn(2, 3, 4), torch.randn(2, 3, 1)
    loss_fn = lambda model: lambda x, y: (model(x) - y).pow(2).mean()  # noqa: E731
    small, big = tiny_regression(), tiny_regression()
    opt_small = torch.optim.SGD(small.parameters(), lr=0.1)
    opt_big = torch.optim.SGD(big.parameters(), lr=0.1)
    cpu, fp32 = torch.device("cpu"), contextlib.nullcontext
    loss, norm = first_step(TrainStep(loss_fn(small), _Batches(xs, ys), [opt_small], fp32, 2, 0.0, cpu))
    big_loss, big_norm = first_step(
        TrainStep(loss_fn(big), _Batches(xs.reshape(1, 6, 4), ys.reshape(1, 6, 1)), [opt_big], fp32, 1, 0.0, cpu)
    )
    assert loss.item() == pytest.approx(big_loss.item(), rel=1e-6)
    assert norm.item() == pytest.approx(big_norm.item(), rel=1e-6)
    for a, b in zip(small.parameters(), big.parameters()):
        torch.testing.assert_close(a, b)
    # grad_clip=0 means no clipping: SGD moved the weights by lr × the whole gradient.
    moved = torch.cat(
        [(a.detach() - b.detach()).flatten() for a, b in zip(big.parameters(), tiny_regression().parameters())]
    )
    assert moved.norm().item() == pytest.approx(0.1 * big_norm.item(), rel=1e-5)
    # Clipping: the applied update is scaled so the gradient norm is at most grad_clip.
    clipped = tiny_regression()
    opt = torch.optim.SGD(clipped.parameters(), lr=1.0)
    start = [p.detach().clone() for p in clipped.parameters()]
    _, raw_norm = first_step(TrainStep(loss_fn(clipped), _Batches(xs, ys), [opt], fp32, 2, 1e-3, cpu))
    moved = torch.cat([(p.detach() - s).flatten() for p, s in zip(clipped.parameters(), start)]).norm()
    assert raw_norm.item() > 1e-2 and moved.item() == pytest.approx(1e-3, rel=1e-4)


# ---- precision: the step computes in the run's precision (trainer.precision) -------------------------


def _tiny_lm_step(precision: str):
    """One TrainStep of a tiny Transformer + CausalLMLoss with fused AdamW, every aten op recorded."""
    from model import Transformer
    from tests.dtype_recorder import OpDtypes
    from tests.model_helpers import tiny_model_config
    from training.loop import CausalLMLoss, autocast_context

    cpu = torch.device("cpu")
    torch.manual_seed(0)
    model = Transformer(tiny_model_config())
    loss_module = CausalLMLoss(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 2, 13), generator=torch.Generator().manual_seed(0))
    batches = _Batches(ids[:, :, :-1], ids[:, :, 1:])
    with OpDtypes() as ops:
        loss, grad_norm = first_step(
            TrainStep(loss_module, batches, [opt], autocast_context(precision, cpu), 2, 1.0, cpu)
        )
    return model, opt, loss, grad_norm, ops


def test_a_bf16_step_runs_every_matmul_in_bf16_the_loss_in_fp32_and_keeps_fp32_masters():
    model, opt, loss, grad_norm, ops = _tiny_lm_step("bf16")
    matmuls = ops.dtypes_of(MATMULS)
    # 2 micro-batches × 2 layers × (4 attention + 3 SwiGLU projections… fused: 2) + head, forward and backward
    assert len(matmuls) > 2 * 2 * 6 * 2
    assert all(set(d) == {torch.bfloat16} for d in matmuls), sorted(set(matmuls))
    assert all(set(d) == {torch.bfloat16} for d in ops.dtypes_of(ATTENTION))
    # The log-softmax of the cross-entropy reads fp32 logits (rare tokens' probabilities survive).
    softmax = ops.dtypes_of(SOFTMAX_LOSS)
    assert softmax and all(set(d) == {torch.float32} for d in softmax)
    assert loss.dtype == grad_norm.dtype == torch.float32
    # Master weights and AdamW's moments stay fp32: small updates are not rounded away.
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(v.dtype == torch.float32 for s in opt.state.values() for k, v in s.items() if k != "step")


def test_an_fp32_step_runs_every_matmul_in_fp32():
    _, _, loss, _, ops = _tiny_lm_step("fp32")
    matmuls = ops.dtypes_of(MATMULS)
    assert matmuls and all(set(d) == {torch.float32} for d in matmuls)
    assert loss.dtype == torch.float32


@pytest.mark.parametrize(
    "last_good, where",
    [
        (None, "no checkpoint was written yet"),
        ("ck/step_0000002", "the last good checkpoint is ck/step_0000002"),
    ],
)
def test_the_stop_message_names_the_last_good_checkpoint_or_says_there_is_none(last_good, where):
    guard = NonFiniteGuard(torch.device("cpu"))
    guard.update(torch.tensor(False), 3)
    with pytest.raises(NonFiniteLoss) as e:
        guard.check(4, lambda: Path(last_good) if last_good else None)
    assert str(e.value) == (
        f"non-finite loss or gradient at step 3 (update skipped, weights unchanged); {where} — "
        "lower optim.lr, raise optim.warmup_steps or check the data, or set "
        "trainer.skip_nonfinite_steps=N to skip such steps"
    )


class _NoSyncLoss:
    """A loss module shaped like DDP's wrapper: `no_sync()` records the micro-step it was entered on."""

    def __init__(self, model):
        self.model, self.micro, self.entered = model, 0, []

    @contextlib.contextmanager
    def no_sync(self):
        self.entered.append(self.micro)
        yield

    def __call__(self, x, y):
        self.micro += 1
        return (self.model(x) - y).pow(2).mean()


@pytest.mark.parametrize("accum, unsynced", [(1, []), (3, [0, 1])])
def test_under_ddp_gradients_sync_only_on_the_last_micro_step(accum, unsynced):
    """DDP all-reduces on every backward outside `no_sync`: every micro-step but the last skips it (the torchrun
    tests check the result across processes; this checks the choice, where mutation testing can see it)."""
    torch.manual_seed(0)
    xs, ys = torch.randn(accum, 3, 4), torch.randn(accum, 3, 1)
    model = tiny_regression()
    loss = _NoSyncLoss(model)
    TrainStep(
        loss,
        _Batches(xs, ys),
        [torch.optim.SGD(model.parameters(), lr=0.1)],
        contextlib.nullcontext,
        accum,
        0.0,
        torch.device("cpu"),
    )(0)
    assert loss.entered == unsynced


def test_under_fsdp2_the_grad_norm_is_the_full_tensors(monkeypatch):
    """FSDP2's get_total_norm returns a DTensor of the local shards' norm: the step reports its full_tensor()."""

    class Sharded:
        def full_tensor(self):
            return torch.tensor(7.0)

    monkeypatch.setattr(torch.nn.utils, "get_total_norm", lambda grads, **kwargs: Sharded())
    model = tiny_regression()
    model(torch.randn(2, 4)).sum().backward()
    assert global_grad_norm(list(model.parameters())).item() == 7.0


def test_a_nonfinite_gradient_gives_a_nonfinite_norm_not_an_exception():
    model = tiny_regression()
    params = list(model.parameters())
    for p in params:
        p.grad = torch.zeros_like(p)
    params[0].grad[0, 0] = float("inf")
    assert global_grad_norm(params).item() == float("inf")


def test_by_default_a_train_step_stops_at_the_first_nonfinite_step():
    """TrainStep's default policy is trainer.skip_nonfinite_steps=0: stop, never skip silently."""
    model = tiny_regression()
    xs, ys = torch.full((1, 3, 4), float("nan")), torch.zeros(1, 3, 1)
    step = TrainStep(
        lambda x, y: (model(x) - y).pow(2).mean(),
        _Batches(xs, ys),
        [torch.optim.SGD(model.parameters(), lr=0.1)],
        contextlib.nullcontext,
        1,
        0.0,
        torch.device("cpu"),
    )
    step(0)
    with pytest.raises(NonFiniteLoss, match="non-finite loss or gradient at step 1"):
        step.guard.check(1, lambda: None)


def test_with_skipping_allowed_the_guard_stops_at_the_nth_nonfinite_step_in_a_row_only():
    """trainer.skip_nonfinite_steps=3: isolated bad steps are skipped and counted; the third in a row stops the run
    with one line (test_faults.py runs it end to end; this holds the policy where mutation testing sees it)."""
    guard = NonFiniteGuard(torch.device("cpu"), tolerated=3)
    for step, ok in enumerate([False, True, False, False], start=1):
        guard.update(torch.tensor(ok), step)
    assert guard.check(4, pytest.fail) == {"skipped": 3, "streak": 2, "max_streak": 2, "first_bad": 1}
    guard.update(torch.tensor(False), 5)
    with pytest.raises(NonFiniteLoss) as e:
        guard.check(5, lambda: Path("ck/step_0000004"))
    assert str(e.value) == (
        "3 non-finite steps in a row (trainer.skip_nonfinite_steps=3) by step 5; the last good "
        "checkpoint is ck/step_0000004 — lower optim.lr, raise optim.warmup_steps or check the data"
    )
