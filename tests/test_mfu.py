"""training/mfu.py: the exact GPU model picks the peak, anything else is measured; TF32 only on CUDA."""
import pytest
import torch

from training.runtime import mfu


@pytest.mark.parametrize("name, label", [
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
])
def test_each_listed_gpu_gets_its_own_row(name, label):
    assert mfu.gpu_peak(name).label == label


@pytest.mark.parametrize("name", ["NVIDIA A10G", "NVIDIA L40G", "NVIDIA H100", "NVIDIA H800", "Tesla V100-SXM2-16GB",
                                  "NVIDIA GeForce RTX 4090 D", "NVIDIA B200", "AMD Instinct MI300X", ""])
def test_unlisted_or_ambiguous_names_are_not_guessed(name):
    assert mfu.gpu_peak(name) is None


def test_variants_that_differ_get_different_peaks():
    # The bugs this table replaces: "L4" matched "L40", "H100" matched the PCIe card.
    peaks = {n: mfu.gpu_peak(n).bf16 for n in ("NVIDIA L4", "NVIDIA L40", "NVIDIA L40S", "NVIDIA H100 80GB HBM3",
                                              "NVIDIA H100 PCIe", "NVIDIA H100 NVL")}
    assert len(set(peaks.values())) == len(peaks)
    for peak in (p for _, p in mfu.GPU_PEAKS):
        assert 0.45 < peak.tf32 / peak.bf16 < 0.55  # dense TF32 is half of dense bf16 on all of these


@pytest.fixture
def fake_cuda(monkeypatch, exact_fp32):
    measured = []
    monkeypatch.setattr(mfu, "measure_matmul_flops", lambda device, dtype, n=2048, **k: measured.append(dtype) or 7e12)

    def use(name):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
        return measured
    return use


def test_known_gpu_uses_the_data_sheet_in_the_runs_precision(fake_cuda, monkeypatch):
    measured = fake_cuda("NVIDIA H100 PCIe")
    cuda = torch.device("cuda", 0)
    flops, source = mfu.peak_flops(cuda, "bf16")
    assert flops == 756.5e12 and "H100 PCIe dense bf16" in source
    # fp32 without TF32 runs on the fp32 units, not the tensor cores: measure, don't quote TF32.
    assert mfu.peak_flops(cuda, "fp32") == (7e12, "measured float32 matmul on NVIDIA H100 PCIe")
    assert measured == [torch.float32]
    torch.backends.cuda.matmul.allow_tf32 = True
    assert mfu.peak_flops(cuda, "fp32")[0] == 378.0e12


def test_unknown_gpu_and_cpu_are_measured(fake_cuda):
    measured = fake_cuda("NVIDIA A10G")
    assert mfu.peak_flops(torch.device("cuda", 0), "bf16") == (7e12, "measured bfloat16 matmul on NVIDIA A10G")
    flops, source = mfu.peak_flops(torch.device("cpu"), "bf16")
    assert flops == 7e12 and source.startswith("measured bfloat16 matmul on cpu")  # never a GPU's number
    assert measured == [torch.bfloat16, torch.bfloat16]
    assert mfu.peak_flops(torch.device("cpu"), "fp32", override_tflops=2.5) == (2.5e12, "trainer.peak_tflops")


def test_measured_cpu_peak_is_plausible_and_leaves_the_rng_alone(monkeypatch):
    monkeypatch.setattr(mfu, "_MEASURED", {})  # a real measurement, not one an earlier test left
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    flops = mfu.measure_matmul_flops(torch.device("cpu"), torch.float32, n=512, budget_s=0.2)
    assert torch.equal(torch.rand(3), expected)
    assert 1e9 < flops < 1e14  # between a slow core and more than any CPU's fp32 peak



def test_a_process_measures_each_setting_once(monkeypatch):
    """Runs in one process (a Hydra sweep's jobs under the basic launcher) share one measurement per device,
    dtype and thread count, so their MFUs compare; another thread count is measured anew."""
    calls = []
    monkeypatch.setattr(mfu, "_MEASURED", {})
    monkeypatch.setattr(mfu, "_measure", lambda device, dtype, *a: calls.append((dtype, torch.get_num_threads())) or 5e9)
    cpu, threads = torch.device("cpu"), torch.get_num_threads()
    assert [mfu.measure_matmul_flops(cpu, torch.float32) for _ in range(2)] == [5e9, 5e9]
    mfu.measure_matmul_flops(cpu, torch.bfloat16)
    try:
        torch.set_num_threads(threads + 1)
        mfu.measure_matmul_flops(cpu, torch.float32)
    finally:
        torch.set_num_threads(threads)
    assert calls == [(torch.float32, threads), (torch.bfloat16, threads), (torch.float32, threads + 1)]


def test_a_cpu_peak_is_the_best_any_start_on_this_machine_measured(tmp_path, monkeypatch):
    """trainer.peak_cache: each start measures, and uses the best measured so far for this CPU, thread count, torch
    and dtype, so runs on one machine share an MFU denominator (a busy start does not lower it)."""
    record = tmp_path / "cache" / "peaks.json"
    cpu = torch.device("cpu")
    for measured, expected in ((3e11, 3e11), (2e11, 3e11), (4e11, 4e11)):  # the 2nd start was busy
        monkeypatch.setattr(mfu, "measure_matmul_flops", lambda *a, **k: measured)
        flops, source = mfu.peak_flops(cpu, "bf16", kept_in=record)
        assert flops == expected
    assert source.endswith(f", the best of 3 starts on this machine ({record})")
    flops, source = mfu.peak_flops(cpu, "fp32", kept_in=record)  # another dtype: a record of its own
    assert flops == 4e11 and ", the best of 1 starts on this machine" in source
    record.write_text("{not json")  # damaged: started anew, never an error
    monkeypatch.setattr(mfu, "measure_matmul_flops", lambda *a, **k: 1e11)
    assert mfu.peak_flops(cpu, "bf16", kept_in=record) == (1e11, "measured bfloat16 matmul on cpu, "
                                                            f"{torch.get_num_threads()} threads, the best of 1 starts "
                                                            f"on this machine ({record})")
    assert mfu.peak_flops(cpu, "bf16", kept_in=None)[1].endswith("threads")  # null: this start's own measurement
