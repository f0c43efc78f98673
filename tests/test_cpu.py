"""training/runtime/cpu.py: the CPU class is the hardware's, lowered to what ONEDNN_MAX_CPU_ISA lets oneDNN use."""
import pytest
import torch

from training.runtime import cpu as C


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


@pytest.mark.parametrize("flags, cap, expected", [
    ("amx", None, "amx"), ("avx512_bf16", None, "avx512_bf16"), ("avx2", None, "avx2"),
    ("amx", "AVX512_CORE_AMX", "amx"), ("amx", "AVX512_CORE_BF16", "avx512_bf16"), ("amx", "AVX512_CORE", "avx2"),
    ("amx", "avx2", "avx2"), ("avx512_bf16", "AVX512_CORE_AMX", "avx512_bf16"),  # a cap never raises the class
    ("avx2", "ALL", "avx2"), ("amx", "SSE41", "avx2"),
])
def test_the_class_is_the_hardware_lowered_to_the_cap(hardware, monkeypatch, flags, cap, expected):
    hardware(flags)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    cpu = C.cpu_class()
    assert (cpu.name, cpu.hardware, cpu.emulated) == (expected, flags, expected != flags)
    assert cpu.bf16_in_hardware == (expected != "avx2")


def test_it_says_what_the_cpu_reports_and_what_a_cap_does(hardware, monkeypatch):
    hardware("avx512_bf16")
    assert C.cpu_class().describe() == "CPU reports AVX512-BF16"
    hardware("amx")
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    assert C.cpu_class().describe() == "CPU reports AMX-bf16, capped to no AMX/AVX512-BF16 by ONEDNN_MAX_CPU_ISA=AVX2"


def test_an_arm_cpu_is_not_taken_for_an_x86_one(hardware, monkeypatch):
    hardware("amx")
    monkeypatch.setattr(C.platform, "machine", lambda: "aarch64")
    assert C.cpu_class().name == "avx2"  # no oneDNN x86 bf16 path: auto then measures before it picks bf16


def test_the_model_name_is_read(monkeypatch):
    assert C.cpu_model().strip()
