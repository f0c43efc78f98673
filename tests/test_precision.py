"""training/loop.py's precision and training/distributed.py's CPU flags: `auto` takes bf16 where bf16 matmuls run in
hardware — CUDA with bf16, a CPU with AMX or AVX512-BF16 that ONEDNN_MAX_CPU_ISA does not cap — from what the device
reports, never from a start-up measurement; a resume keeps its run's precision; autocast contexts."""

import pytest
import torch

from training import distributed as C
from training import loop as P


@pytest.fixture
def hardware(monkeypatch):
    """Set the flags this 'CPU' reports: hardware('amx') / ('avx512_bf16') / ('avx2')."""

    def set_flags(cls):
        monkeypatch.setattr(C.platform, "machine", lambda: "x86_64")
        monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: cls == "amx")
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: cls in ("amx", "avx512_bf16"))

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    return set_flags


@pytest.mark.parametrize(
    "flags, cap, fast",
    [
        ("amx", None, True),
        ("avx512_bf16", None, True),
        ("avx2", None, False),
        ("amx", "AVX512_CORE_AMX", True),
        ("amx", "AVX512_CORE_BF16", True),
        ("amx", "AVX512_CORE", False),
        ("amx", "avx2", False),
        ("avx512_bf16", "AVX512_CORE_AMX", True),
        ("avx2", "ALL", False),
        ("amx", "SSE41", False),
        ("amx", "DEFAULT", True),
        ("avx512_bf16", "AVX10_1_512", True),
    ],
)
def test_bf16_is_in_hardware_where_the_cpu_has_it_and_onednn_may_use_it(hardware, monkeypatch, flags, cap, fast):
    hardware(flags)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert C.cpu_bf16()[0] is fast
    assert P.resolve_precision("auto", torch.device("cpu"))[0] == ("bf16" if fast else "fp32")


def test_it_says_what_the_cpu_reports_and_what_a_cap_does(hardware, monkeypatch):
    hardware("avx512_bf16")
    assert P.resolve_precision("auto", torch.device("cpu")) == ("bf16", "CPU reports AVX512-BF16")
    hardware("avx2")
    assert P.resolve_precision("auto", torch.device("cpu")) == (
        "fp32",
        "CPU reports no AMX/AVX512-BF16: bf16 is emulated",
    )
    hardware("amx")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert P.resolve_precision("auto", torch.device("cpu")) == (
        "fp32",
        "CPU reports AMX-bf16, capped by ONEDNN_MAX_CPU_ISA=AVX2: bf16 is emulated",
    )


def test_an_arm_cpu_is_not_taken_for_an_x86_one(hardware, monkeypatch):
    hardware("amx")
    monkeypatch.setattr(C.platform, "machine", lambda: "aarch64")
    assert C.cpu_bf16() == (False, "CPU reports no AMX/AVX512-BF16")


def test_auto_on_cuda_asks_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert P.resolve_precision("auto", torch.device("cuda", 0)) == ("fp32", "this CUDA device has no bf16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert P.resolve_precision("auto", torch.device("cuda", 0))[0] == "bf16"
    assert P.resolve_precision("auto", torch.device("mps"))[0] == "fp32"


def test_explicit_choices_are_kept():  # unknown ones: TrainerConfig (tests/test_train.py)
    assert P.resolve_precision("bf16", torch.device("cpu")) == ("bf16", "trainer.precision")
    assert P.resolve_precision("fp32", torch.device("cpu")) == ("fp32", "trainer.precision")


def test_the_decision_draws_nothing_from_the_training_generator_and_takes_no_time():
    import time

    torch.manual_seed(0)
    before, start = torch.get_rng_state(), time.perf_counter()
    P.resolve_precision("auto", torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before)  # a resume stays bitwise
    assert time.perf_counter() - start < 0.1  # flags, not a benchmark


def test_autocast_runs_matmuls_in_bf16_only_when_asked():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with P.autocast_context("bf16", torch.device("cpu"))():
        assert (x @ w).dtype == torch.bfloat16
    with P.autocast_context("fp32", torch.device("cpu"))():
        assert (x @ w).dtype == torch.float32
    with pytest.raises(ValueError, match="not supported on mps"):
        P.autocast_context("bf16", torch.device("mps"))


@pytest.mark.parametrize(
    "requested, trained_in, flags, expected",
    [
        ("auto", "bf16", "amx", "bf16"),  # the same machine class: kept
        ("auto", "fp32", "amx", "fp32"),  # started on an AVX2 CPU: kept, though bf16 would be faster here
        ("bf16", "bf16", "avx2", "bf16"),  # asked for: kept, slowly
        ("auto", "", "amx", "bf16"),  # a new run (nothing trained yet): decided by the device
        ("auto", "", "avx2", "fp32"),
    ],
)
def test_a_resume_keeps_the_precision_its_run_trained_in(hardware, requested, trained_in, flags, expected):
    hardware(flags)
    precision, why, warning = P.resume_precision(requested, torch.device("cpu"), trained_in, step=20)
    assert (precision, warning) == (expected, None)
    assert ("a resume keeps it" in why) == (trained_in != "" and requested == "auto")


def test_a_bf16_run_resumed_where_bf16_is_emulated_continues_in_fp32_and_says_so(hardware):
    hardware("avx2")
    precision, why, warning = P.resume_precision("auto", torch.device("cpu"), "bf16", step=304)
    assert precision == "fp32" and why == "CPU reports no AMX/AVX512-BF16: bf16 is emulated"
    assert warning == (
        f"warning: this run trained in bf16 up to step 304 and continues in fp32 ({why}, so auto does "
        "not keep bf16): from here on it is not what an uninterrupted run computes; "
        "trainer.precision=bf16 keeps bf16, slowly"
    )
    precision, _, warning = P.resume_precision("fp32", torch.device("cpu"), "bf16", step=304)
    assert precision == "fp32" and warning == (
        "warning: this run trained in bf16 up to step 304 and continues in fp32 (trainer.precision=fp32): from "
        "here on it is not what an uninterrupted run computes"
    )
