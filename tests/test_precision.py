"""training/precision.py: `auto` takes bf16 only where the run's bf16 matmuls measure fast enough, and says what the
CPU reports and what was measured; autocast contexts."""
import pytest
import torch

from training import precision as P
from training.runtime.cpu import CpuClass


AMX_CPU = CpuClass(name="amx", hardware="amx", cap=None, model="a CPU")
AVX512_CPU = CpuClass(name="avx512_bf16", hardware="avx512_bf16", cap=None, model="a CPU")
AVX2_CAPPED = CpuClass(name="avx2", hardware="amx", cap="AVX2", model="a CPU")


def fake(monkeypatch, cpu, bf16_s, fp32_s):
    """This CPU class and these measured round times, in place of the machine's."""
    monkeypatch.setattr(P, "cpu_class", lambda: cpu)
    monkeypatch.setattr(P, "measure", lambda shapes, full=True: P.Timing(bf16_s, fp32_s, "the stand-in shapes"))


@pytest.mark.parametrize("cpu, bf16_s, fp32_s, expected, why", [
    (AMX_CPU, 0.0004, 0.001, "bf16", "CPU reports AMX-bf16; bf16 measured 2.5× faster than fp32 on the stand-in shapes"),
    (AVX512_CPU, 0.0009, 0.001, "fp32", "CPU reports AVX512-BF16; bf16 measured only 1.11× as fast as fp32 on the "
                                        "stand-in shapes, below the 1.2× that auto asks"),
    (AVX512_CPU, 0.0017, 0.001, "fp32", "CPU reports AVX512-BF16; bf16 measured 1.7× slower than fp32 on the "
                                        "stand-in shapes"),
    (AVX2_CAPPED, 0.030, 0.001, "fp32", "CPU reports AMX-bf16, capped to no AMX/AVX512-BF16 by ONEDNN_MAX_CPU_ISA=AVX2: "
                                        "bf16 is emulated; bf16 measured 30.0× slower than fp32 on the stand-in shapes"),
])
def test_auto_on_cpu_says_what_the_cpu_reports_and_what_was_measured(monkeypatch, cpu, bf16_s, fp32_s, expected, why):
    fake(monkeypatch, cpu, bf16_s, fp32_s)
    assert P.resolve_precision("auto", torch.device("cpu")) == (expected, why)


def test_bf16_needs_the_margin_not_just_a_win():
    at = P.BF16_MARGIN
    assert P.decide(AMX_CPU, P.Timing(1.0, at, "x"))[0] == "bf16"
    assert P.decide(AMX_CPU, P.Timing(1.0, at * 0.999, "x"))[0] == "fp32"


def test_the_measurement_times_the_runs_shapes_where_bf16_is_in_hardware_and_one_small_matmul_where_emulated():
    shapes = [(4096, 64, 96), (4096, 64, 96), (8, 32, 16)]
    full = P.measure(shapes, full=True)
    assert full.what == "the run's 2 matmul shapes, best of 11 interleaved rounds of one thread's CPU time"  # once each
    assert full.bf16_s > 0 and full.fp32_s > 0
    small = P.measure(shapes, full=False)
    assert small.what.startswith("one 256³ matmul") and small.what.endswith("best of 3 interleaved rounds of one thread's CPU time")


def test_the_timed_thread_does_the_work_and_the_thread_count_comes_back(monkeypatch):
    """The timing is this thread's CPU time, so the matmuls must run on it: were they handed to worker threads,
    the clock would see only their dispatch. No core does a 256³ fp32 matmul (33.5 MFLOP) at 1 TFLOP/s, so a
    round under 33 µs of this thread's time means the work ran elsewhere."""
    before, run, threads = torch.get_num_threads(), P._run, set()
    monkeypatch.setattr(P, "_run", lambda pairs, repeats: threads.add(torch.get_num_threads()) or run(pairs, repeats))
    timing = P.measure([(256, 256, 256)], full=True)
    assert threads == {1}  # with two threads, half the work would run where this clock cannot see it
    assert timing.fp32_s > 2 * 256 ** 3 / 1e12 and timing.bf16_s > 2 * 256 ** 3 / 1e12
    assert torch.get_num_threads() == before


def test_each_dtype_is_timed_by_its_least_disturbed_round(monkeypatch):
    """A busy machine only adds time to a round: with bf16 disturbed in 8 of 11 rounds (a median would see 5 s
    and call bf16 2.5× slower), the timing is each dtype's best round, and bf16 stays 2× faster."""
    calls = {torch.float32: 0, torch.bfloat16: 0}

    def run(pairs, repeats):
        dtype = pairs[0][0].dtype
        calls[dtype] += 1
        disturbed = dtype == torch.bfloat16 and calls[dtype] % 11 not in (3, 6, 9)
        return repeats * ((5.0 if disturbed else 1.0) if dtype == torch.bfloat16 else 2.0)

    monkeypatch.setattr(P, "_run", run)
    timing = P.measure([(64, 64, 64)], full=True)
    assert (timing.bf16_s, timing.fp32_s, timing.speedup) == (1.0, 2.0, 2.0)
    assert calls == {torch.float32: 2 + P.ROUNDS, torch.bfloat16: 2 + P.ROUNDS}  # warm-up, sizing, the rounds


def test_auto_on_cuda_asks_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert P.resolve_precision("auto", torch.device("cuda", 0)) == ("fp32", "this CUDA device has no bf16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert P.resolve_precision("auto", torch.device("cuda", 0))[0] == "bf16"
    assert P.resolve_precision("auto", torch.device("mps"))[0] == "fp32"


def test_explicit_choices_are_kept_and_unknown_ones_refused():
    assert P.resolve_precision("bf16", torch.device("cpu")) == ("bf16", "trainer.precision")
    assert P.resolve_precision("fp32", torch.device("cpu")) == ("fp32", "trainer.precision")
    with pytest.raises(ValueError, match="trainer.precision='fp8' is unknown"):
        P.resolve_precision("fp8", torch.device("cpu"))


def test_the_measurement_draws_nothing_from_the_training_generator():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    P.resolve_precision("auto", torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before)  # a resume stays bitwise


def test_autocast_runs_matmuls_in_bf16_only_when_asked():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with P.autocast_context("bf16", torch.device("cpu"))():
        assert (x @ w).dtype == torch.bfloat16
    with P.autocast_context("fp32", torch.device("cpu"))():
        assert (x @ w).dtype == torch.float32


def test_tf32_is_enabled_only_on_cuda(exact_fp32):
    assert not P.enable_tf32(torch.device("cpu")) and not torch.backends.cuda.matmul.allow_tf32
    assert P.enable_tf32(torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert not P.enable_tf32(torch.device("cuda", 0), enabled=False)  # trainer.tf32=false: exact fp32
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32


AVX2 = (AVX2_CAPPED, {torch.bfloat16: 0.030, torch.float32: 0.001})  # bf16 emulated: ~30× slower
AMX = (AMX_CPU, {torch.bfloat16: 0.0004, torch.float32: 0.001})


@pytest.mark.parametrize("requested, trained_in, speeds, expected", [
    ("auto", "bf16", AMX, "bf16"),  # the same machine class: kept
    ("auto", "fp32", AMX, "fp32"),  # started on an AVX2 CPU: kept, though bf16 would be faster here
    ("bf16", "bf16", AVX2, "bf16"),  # asked for: kept, slowly
    ("auto", None, AMX, "bf16"),  # a checkpoint from before state.json recorded it: measured, as a new run
    ("auto", None, AVX2, "fp32"),
])
def test_a_resume_keeps_the_precision_its_run_trained_in(monkeypatch, requested, trained_in, speeds, expected):
    fake(monkeypatch, speeds[0], speeds[1][torch.bfloat16], speeds[1][torch.float32])
    precision, why, warning = P.resume_precision(requested, torch.device("cpu"), trained_in, step=20)
    assert (precision, warning) == (expected, None)
    assert ("a resume keeps it" in why) == (trained_in is not None and requested == "auto")


def test_an_fp32_run_resumed_under_auto_does_not_measure(monkeypatch):
    monkeypatch.setattr(P, "measure", lambda *a, **k: pytest.fail("measured"))
    assert P.resume_precision("auto", torch.device("cpu"), "fp32", step=3)[:2] == (
        "fp32", "the run trained in fp32: a resume keeps it (trainer.precision=bf16 switches)")


def test_a_bf16_run_resumed_where_bf16_is_emulated_continues_in_fp32_and_says_so(monkeypatch):
    fake(monkeypatch, AVX2_CAPPED, 0.030, 0.001)
    precision, why, warning = P.resume_precision("auto", torch.device("cpu"), "bf16", step=304)
    assert precision == "fp32" and "30.0× slower" in why
    assert warning == (f"warning: this run trained in bf16 up to step 304 and continues in fp32 ({why}, so auto does "
                       "not keep bf16): from here on it is not what an uninterrupted run computes; "
                       "trainer.precision=bf16 keeps bf16, slowly")
    precision, _, warning = P.resume_precision("fp32", torch.device("cpu"), "bf16", step=304)
    assert precision == "fp32" and warning == (
        "warning: this run trained in bf16 up to step 304 and continues in fp32 (trainer.precision=fp32): from "
        "here on it is not what an uninterrupted run computes")
