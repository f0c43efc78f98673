"""training/compile.py: the auto decision, the eager fallback, and no recompiles between train and eval."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd

from model import ModelConfig, Transformer
from training import loop as C
from training.evaluation import Windows, score
from training.loop import CausalLMLoss

REPO = Path(__file__).resolve().parents[1]
VOCAB = 96


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # guards and graphs of one test must not serve the next
    yield
    torch._dynamo.reset()


def tiny_loss(chunk_above=None, chunk_elements=5 * 128, n_layers=2) -> CausalLMLoss:
    torch.manual_seed(0)
    model = Transformer(
        ModelConfig(
            vocab_size=VOCAB, hidden_size=32, n_layers=n_layers, n_heads=4, n_kv_heads=2, multiple_of=16, max_seq_len=16
        )
    )
    return CausalLMLoss(model, chunk_above=chunk_above, chunk_elements=chunk_elements)


def batch(b=4, t=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, VOCAB, (b, t), generator=gen), torch.randint(0, VOCAB, (b, t), generator=gen)


class CountingBackend:
    """A dynamo backend that runs graphs as traced and counts how many it was handed."""

    def __init__(self):
        self.graphs = 0

    def __call__(self, gm, example_inputs):
        self.graphs += 1
        return gm.forward


# ---- resolve_compile ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "requested, expected",
    [("true", True), ("false", False), (True, True), (False, False), ("True", True), ("FALSE", False)],
)
def test_explicit_choice_is_taken_as_is(requested, expected):
    assert C.resolve_compile(requested, torch.device("mps")) == (expected, f"trainer.compile={str(expected).lower()}")


def test_auto_follows_the_device(monkeypatch):
    monkeypatch.setattr(C, "cpu_toolchain_works", lambda: (False, "CPU: no compiler"))
    assert C.resolve_compile("auto", torch.device("cpu")) == (False, "CPU: no compiler")
    monkeypatch.setattr(C, "cpu_toolchain_works", lambda: (True, "CPU: works"))
    assert C.resolve_compile("auto", torch.device("cpu")) == (True, "CPU: works")
    on, why = C.resolve_compile("auto", torch.device("mps"))
    assert not on and "mps" in why
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: True)
    assert C.resolve_compile("auto", torch.device("cuda", 0))[0] is True
    monkeypatch.setattr("torch.utils._triton.has_triton", lambda: False)
    on, why = C.resolve_compile("auto", torch.device("cuda", 0))
    assert not on and "Triton" in why


def test_toolchain_check_compiles_here(monkeypatch):
    monkeypatch.setattr(C, "_TOOLCHAIN", None)  # not the answer cached by an earlier call
    assert C.cpu_toolchain_works() == (True, "CPU: inductor's C++ toolchain works")


def test_toolchain_check_fails_without_a_compiler(tmp_path):
    # A fresh process and inductor cache, so a kernel built earlier cannot stand in for the compiler,
    # and a "compiler" that always fails.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"), "CXX": "/bin/false"}
    probe = (
        f"import sys; sys.path.insert(0, {str(REPO)!r}); from training.loop import resolve_compile; "
        "print(resolve_compile('auto', __import__('torch').device('cpu')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("(False, \"CPU: inductor's C++ toolchain failed (InvalidCxxCompiler: ")
    assert len(out.stdout.strip().splitlines()) == 1


# ---- inductor's cache, one per CPU instruction set -------------------------------------------------


def test_compiled_code_is_never_shared_across_cpu_instruction_sets(tmp_path):
    """torch 2.13's FX-graph cache key leaves ATEN_CPU_CAPABILITY out: the default run compiled under the AVX2
    emulation and then run plainly on the same cache corrupted its heap (training/loop.py cache_for_this_cpu).
    The toolchain probe compiled on one cache root natively, then under another capability: without the folder
    per capability the second process is served the first one's graph (one FX-graph cache hit); with it, none.
    (That a process finds its own capability's graphs again: test_the_cache_folder_is_named_once_….)"""
    native = torch.backends.cpu.get_cpu_capability().lower()
    if native == "default":
        pytest.skip("ATen runs without vector kernels here: no lower capability to compile for")
    other = "avx2" if native == "avx512" else "default"  # one below this machine's own, whatever its class
    child = (
        "import torch; from training.loop import resolve_compile; from torch._dynamo.utils import counters; "
        "print(resolve_compile('auto', torch.device('cpu'))[0], counters['inductor']['fxgraph_cache_hit'])"
    )

    def hits(
        capability,
    ):  # None: this process's own capability, ATEN_CPU_CAPABILITY included when the suite runs capped
        env = {k: v for k, v in os.environ.items() if k != "TORCHINDUCTOR_CACHE_DIR"}
        env.update(
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path),
            PYTHONPATH=str(REPO),
            **({"ATEN_CPU_CAPABILITY": capability} if capability else {}),
        )
        out = subprocess.run(
            [sys.executable, "-c", child], env=env, cwd=REPO, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr
        compiled, n = out.stdout.split()
        assert compiled == "True"
        return int(n)

    assert [hits(None), hits(other)] == [0, 0]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([f"aten-{native}", f"aten-{other}"])


def test_the_cache_folder_is_named_once_under_the_users_root(tmp_path, monkeypatch):
    """Under TORCHINDUCTOR_CACHE_DIR when set, the same folder every time (so a run finds its compiled graphs
    again); a second call, or a child process that inherits the folder, does not nest it, and a capability of
    its own moves beside it. Deciding to compile and wrapping a module both move there first."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    assert C.cache_for_this_cpu() == tmp_path / "aten-avx512" == C.cache_for_this_cpu()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "aten-avx512")
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert C.cache_for_this_cpu() == tmp_path / "aten-avx2"
    for step in (
        lambda: C.resolve_compile("false", torch.device("cpu")),
        lambda: C.CompiledLoss(tiny_loss(), backend=CountingBackend()),
    ):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
        step()
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "aten-avx2")


# ---- the fallback ---------------------------------------------------------------------------------


def failing_backend(gm, example_inputs):
    raise RuntimeError("injected compiler failure")


@pytest.mark.parametrize(
    "backend, reason",
    [
        (failing_backend, "RuntimeError: injected compiler failure"),  # forward graph fails to compile
        (
            aot_autograd(fw_compiler=lambda gm, _: gm.forward, bw_compiler=failing_backend),
            "RuntimeError: injected compiler failure",
        ),  # only the backward graph fails (lazy by default)
        ("no_such_backend", "no_such_backend"),  # rejected by torch.compile itself
    ],
)
def test_compile_failure_falls_back_to_eager_with_one_warning(backend, reason):
    loss_fn, warnings = tiny_loss(), []
    wrapped = C.CompiledLoss(loss_fn, warn=warnings.append, backend=backend)
    x, y = batch()
    loss = wrapped(x, y)
    loss.backward()  # the step completes
    assert loss.item() == pytest.approx(loss_fn(x, y).item(), rel=1e-6)
    wrapped(x, y).backward()
    with torch.no_grad():
        wrapped(x, y)
    assert len(warnings) == 1 and reason in warnings[0] and warnings[0].startswith("warning: torch.compile failed")
    assert "\n" not in warnings[0] and reason in wrapped.failed


def test_errors_that_are_not_compile_failures_are_raised():
    wrapped = C.CompiledLoss(tiny_loss(), warn=pytest.fail, backend=CountingBackend())
    x, y = batch()
    with pytest.raises(IndexError):  # a token id outside the vocabulary is the caller's bug
        wrapped(x + 1000, y)


def test_wrapper_reaches_the_module():
    loss_fn = tiny_loss()
    wrapped = C.CompiledLoss(loss_fn, backend=CountingBackend())
    wrapped.eval()
    assert not loss_fn.training and wrapped.model is loss_fn.model
    assert list(wrapped.parameters()) == list(loss_fn.parameters())


# ---- recompiles -----------------------------------------------------------------------------------


def train_eval_cycle(call, loss_fn, x, y):
    """A training step and an evaluation whose last batch is partial (training/evaluation.py score pads it), twice."""
    windows = Windows(torch.cat([x, x[:3]]), torch.cat([y, y[:3]]))
    for _ in range(2):
        loss_fn.train()
        call(x, y).backward()
        loss_fn.eval()
        score(call, windows, len(x), torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))


@pytest.mark.parametrize("chunk_above", [None, 0], ids=["one-shot", "chunked"])
def test_one_graph_per_mode_and_no_recompiles(chunk_above):
    loss_fn, counter = tiny_loss(chunk_above), CountingBackend()
    # fullgraph=True: a graph break anywhere in model + loss would raise here (and fall back).
    wrapped = C.CompiledLoss(loss_fn, warn=pytest.fail, backend=counter, fullgraph=True)
    x, y = batch()
    train_eval_cycle(wrapped, loss_fn, x, y)
    assert counter.graphs == 2  # training and no-grad evaluation, each traced once
    assert wrapped.compile_seconds > 0 and wrapped.failed is None


def test_without_padding_the_partial_batch_recompiles():
    # The control for the test above: what the evaluation's padding saves.
    loss_fn, counter = tiny_loss(), CountingBackend()
    compiled, x, y = torch.compile(loss_fn, backend=counter), *batch()
    for _ in range(2):
        loss_fn.eval()
        with torch.no_grad():
            compiled(x, y)
            compiled(x[:3], y[:3])
    assert counter.graphs == 2


def test_padding_keeps_the_partial_batch_loss():
    loss_fn = tiny_loss()
    x, y = batch()
    windows = Windows(torch.cat([x, x[:3]]), torch.cat([y, y[:3]]))
    nats, tokens = score(loss_fn, windows, len(x), torch.device("cpu"), lambda: torch.autocast("cpu", enabled=False))
    with torch.no_grad():
        expected = loss_fn(x, y).double() * y.numel() + loss_fn(x[:3], y[:3]).double() * y[:3].numel()
    assert tokens.item() == y.numel() + y[:3].numel() and nats.item() == pytest.approx(expected.item(), rel=1e-6)


def test_inductor_compiled_chunked_loss_matches_eager():
    # 24 tokens a chunk: 64 tokens make 3 chunks, the last one partial (inductor unrolls the loop, so
    # a few chunks keep the compile short).
    loss_fn = tiny_loss(chunk_above=0, chunk_elements=24 * VOCAB, n_layers=1)
    x, y = batch()
    results = []
    for call in (loss_fn, C.CompiledLoss(loss_fn, warn=pytest.fail)):
        loss_fn.zero_grad(set_to_none=True)
        loss = call(x, y)
        loss.backward()
        results.append((loss.detach(), [p.grad.clone() for p in loss_fn.parameters()]))
    (eager, eager_grads), (compiled, compiled_grads) = results
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
