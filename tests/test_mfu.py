"""training/log.py's MFU peak: the exact GPU model's data sheet, else one quick probe of this device; TF32 only where
it is on; never a GPU's number for a CPU."""

import pytest
import torch

from training import log as mfu


@pytest.mark.parametrize(
    "name, label",
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA H200 NVL", "H200 NVL"),
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA A100-SXM4-40GB", "A100"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA A100-PCIE-40GB", "A100"),
        ("NVIDIA A100 80GB PCIe", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40", "L40"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10", "A10"),
        ("NVIDIA GeForce RTX 4090", "GeForce RTX 4090"),
    ],
)
def test_each_listed_gpu_gets_its_own_row(name, label):
    assert mfu.gpu_peak(name)[0] == label


@pytest.mark.parametrize(
    "name",
    [
        "NVIDIA A10G",
        "NVIDIA L40G",
        "NVIDIA H100",
        "NVIDIA H800",
        "Tesla V100-SXM2-16GB",
        "NVIDIA GeForce RTX 4090 D",
        "NVIDIA B200",
        "AMD Instinct MI300X",
        "",
    ],
)
def test_unlisted_or_ambiguous_names_are_not_guessed(name):
    assert mfu.gpu_peak(name) is None


def test_variants_that_differ_get_different_peaks():
    # The bugs the table replaced: "L4" matched "L40", "H100" matched the PCIe card.
    peaks = {
        n: mfu.gpu_peak(n)[1]
        for n in (
            "NVIDIA L4",
            "NVIDIA L40",
            "NVIDIA L40S",
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA H100 NVL",
        )
    }
    assert len(set(peaks.values())) == len(peaks)
    for _, bf16, tf32, _ in mfu.GPU_PEAKS.values():
        assert 0.45 < tf32 / bf16 < 0.55  # dense TF32 is half of dense bf16 on all of these


@pytest.fixture
def fake_cuda(monkeypatch, exact_fp32):
    probed = []
    monkeypatch.setattr(mfu, "quick_peak", lambda device, dtype: probed.append((device.type, dtype)) or 7e12)

    def use(name):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return probed

    return use


def test_known_gpu_uses_the_data_sheet_in_the_runs_precision(fake_cuda):
    probed, cuda = fake_cuda("NVIDIA H100 PCIe"), torch.device("cuda", 0)
    flops, source = mfu.peak_flops(cuda, "bf16")
    assert flops == 756.5e12 and "H100 PCIe dense bf16" in source
    # fp32 without TF32 runs on the fp32 units, not the tensor cores: probe, don't quote TF32.
    assert mfu.peak_flops(cuda, "fp32") == (7e12, "one quick float32 matmul probe on NVIDIA H100 PCIe")
    assert probed == [("cuda", torch.float32)]
    torch.backends.cuda.matmul.allow_tf32 = True
    assert mfu.peak_flops(cuda, "fp32")[0] == 378.0e12


def test_unknown_gpu_and_cpu_are_probed(fake_cuda):
    probed = fake_cuda("NVIDIA A10G")
    assert mfu.peak_flops(torch.device("cuda", 0), "bf16") == (7e12, "one quick bfloat16 matmul probe on NVIDIA A10G")
    flops, source = mfu.peak_flops(torch.device("cpu"), "bf16")
    assert flops == 7e12 and source.startswith("one quick bfloat16 matmul probe on cpu")  # never a GPU's number
    assert probed == [("cuda", torch.bfloat16), ("cpu", torch.bfloat16)]
    assert mfu.peak_flops(torch.device("cpu"), "fp32", override_tflops=2.5) == (2.5e12, "trainer.peak_tflops")


def test_the_quick_probe_is_plausible_quick_and_leaves_the_rng_alone():
    import time

    torch.manual_seed(0)
    before, start = torch.get_rng_state(), time.perf_counter()
    flops = mfu.quick_peak(torch.device("cpu"), torch.float32)
    assert 1e9 < flops < 1e14 and time.perf_counter() - start < 1.5
    assert torch.equal(torch.get_rng_state(), before)
