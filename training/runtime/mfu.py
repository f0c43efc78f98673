"""Peak matmul throughput for model-FLOPs utilisation (MFU): from the data sheet of the exact GPU, or measured (a CPU's
best measurement kept per machine)."""
import json
import os
import re
import time
from pathlib import Path
from typing import NamedTuple, Optional

import torch

from training.runtime.cpu import cpu_class


class GpuPeak(NamedTuple):
    label: str
    bf16: float  # dense bf16 tensor-core FLOP/s (data sheets quote 2× "with sparsity": not used here)
    tf32: float  # dense TF32 FLOP/s: what fp32 matmuls get once TF32 is on (training/precision.py)
    memory_gb: Optional[float] = None  # the data sheet's memory (1e9 bytes); None where the model comes in several


# Exact models only, matched against the whole name torch reports (lower case, "-"/"_" as spaces,
# "nvidia " dropped): "H100" alone must not pick the SXM card for a PCIe one, nor "L4" an L40.
# A card not listed here is measured instead. Sources: NVIDIA data sheets, dense (no sparsity).
GPU_PEAKS = (
    (r"h100( sxm5?)?( \d+gb)? hbm3e?|h100 sxm5?( \d+gb)?", GpuPeak("H100 SXM", 989.4e12, 494.7e12, 80)),
    (r"h100 pcie( \d+gb)?", GpuPeak("H100 PCIe", 756.5e12, 378.0e12, 80)),
    (r"h100 nvl", GpuPeak("H100 NVL", 835.5e12, 417.5e12, 94)),
    (r"h200( sxm5?)?( \d+gb)?( hbm3e)?", GpuPeak("H200 SXM", 989.4e12, 494.7e12, 141)),
    (r"h200 nvl", GpuPeak("H200 NVL", 835.5e12, 417.5e12, 141)),
    (r"gh200( \d+gb?)?( hbm3e?)?", GpuPeak("GH200", 989.4e12, 494.7e12)),  # 96 or 144 GB
    (r"a100( sxm4?| pcie)?( \d+gb)?( pcie)?", GpuPeak("A100", 312e12, 156e12)),  # 40 and 80 GB alike
    (r"a10", GpuPeak("A10", 125e12, 62.5e12, 24)),
    (r"a40", GpuPeak("A40", 149.7e12, 74.8e12, 48)),
    (r"l4", GpuPeak("L4", 121e12, 60e12, 24)),
    (r"l40", GpuPeak("L40", 181.05e12, 90.5e12, 48)),
    (r"l40s", GpuPeak("L40S", 362.05e12, 183e12, 48)),
    (r"geforce rtx 4090", GpuPeak("GeForce RTX 4090", 165.2e12, 82.6e12, 24)),  # fp32 accumulate
)


def gpu_peak(device_name: str) -> Optional[GpuPeak]:
    """The data-sheet peaks of exactly this GPU model, or None when it is not in the table."""
    name = re.sub(r"[-_\s]+", " ", device_name.lower()).strip()
    name = re.sub(r"^(nvidia|tesla) ", "", name)
    for pattern, peak in GPU_PEAKS:
        if re.fullmatch(pattern, name):
            return peak
    return None


def gpu_memory_bytes(device_name: str) -> Optional[float]:
    """This GPU's memory from its name ("A100 SXM4 40GB": 40 GB) or the data sheet (H100 SXM: 80 GB), in bytes
    (1 GB = 1e9: at or under what torch reports, e.g. 85.0e9 for an 80 GB H100); None when neither says."""
    sheet = gpu_peak(device_name)
    if sheet is None:
        return None
    named = re.search(r"(\d+)\s*gb", device_name.lower())
    gb = float(named.group(1)) if named else sheet.memory_gb
    return gb * 1e9 if gb else None


def peak_flops(device: torch.device, precision: str, override_tflops: Optional[float] = None,
               kept_in: Optional[Path] = None) -> tuple:
    """(FLOP/s, how it was obtained) for a resolved precision (bf16 | fp32).

    Never a GPU's number for a CPU, nor a data sheet's for a GPU it does not describe: anything
    not looked up exactly is measured on this device, in the precision the run computes in. A CPU's
    measured peak is kept in `kept_in` (trainer.peak_cache), and each start uses the best any start on
    this machine has measured: a 2-core machine's speed moves 2-3× with its neighbours' load, and a
    peak measured afresh moved 0.29-0.39 TFLOP/s between starts, so two runs' MFUs did not compare.
    """
    if override_tflops:
        return override_tflops * 1e12, "trainer.peak_tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = gpu_peak(name)
        if peak is not None and precision == "bf16":
            return peak.bf16, f"data sheet: {peak.label} dense bf16 ({name})"
        if peak is not None and precision == "fp32" and torch.backends.cuda.matmul.allow_tf32:
            return peak.tf32, f"data sheet: {peak.label} dense TF32 ({name})"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    # A GPU needs big operands to reach its peak; 2048³ is already CPU-sized.
    flops = measure_matmul_flops(device, dtype, n=8192 if device.type == "cuda" else 2048)
    source = f"measured {str(dtype).replace('torch.', '')} matmul on {_device_label(device)}"
    if kept_in is not None and device.type == "cpu":
        flops, starts = best_kept(Path(kept_in).expanduser(), _machine_key(dtype), flops)
        source += f", the best of {starts} starts on this machine ({kept_in})"
    return flops, source


def best_kept(path: Path, key: str, measured: float) -> tuple:
    """(the best peak measured for `key` on this machine, this one included; how many starts measured it),
    recorded in the JSON file `path`. An unreadable file is started anew; one that cannot be written
    only loses the record (the run goes on with what it measured)."""
    try:
        kept = json.loads(path.read_text())
        if not isinstance(kept, dict):
            kept = {}
    except (OSError, ValueError):
        kept = {}
    entry = kept.get(key) if isinstance(kept.get(key), dict) else {}
    best = max(measured, float(entry.get("flops", 0.0)))
    starts = int(entry.get("starts", 0)) + 1
    kept[key] = {"flops": best, "starts": starts}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept, indent=1, sort_keys=True))
        os.replace(tmp, path)  # atomic: two starts at once never leave half a file
    except OSError:
        pass
    return best, starts


def _machine_key(dtype: torch.dtype) -> str:
    """What a peak belongs to: the CPU (model and class, a cap included), the thread count, torch, the dtype."""
    cpu = cpu_class()
    return (f"{cpu.model} | {cpu.name}{f' (ONEDNN_MAX_CPU_ISA={cpu.cap})' if cpu.cap else ''} | "
            f"{torch.get_num_threads()} threads | torch {torch.__version__} | {str(dtype).replace('torch.', '')}")


_MEASURED = {}  # one measurement per process and setting: the in-process jobs of a sweep share it, so their MFUs compare


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 2048, budget_s: float = 1.0) -> float:
    """The highest square-matmul throughput this device and thread count reach (the achievable peak), measured
    once per process for each (device, dtype, size, threads)."""
    key = (str(device), dtype, n, budget_s, torch.get_num_threads())
    if key not in _MEASURED:
        _MEASURED[key] = _measure(device, dtype, n, budget_s)
    return _MEASURED[key]


def _measure(device: torch.device, dtype: torch.dtype, n: int, budget_s: float) -> float:
    """The best throughput over sizes 256, 512, … up to `n`, each timed many times.

    A peak is a maximum, so best-of is the right statistic, and it is robust to a busy machine only with
    many short trials: one 2048³ matmul (25-70 ms on a CPU) is almost always cut by another process's
    time slice, while among dozens of 1-5 ms ones some run untouched (starts beside two busy processes
    moved best-of-8 of 2048³ by 30 %; BENCHMARKS.md). Sizes stop growing while one matmul would eat
    too much of the budget: an emulated bf16 2048³ matmul takes ~20 s on an AVX2-only CPU, and a run's
    start-up must not. The operands come from a private generator, so measuring never moves the
    training RNG (a resumed run must draw exactly what the uninterrupted one drew).
    """
    gen = torch.Generator().manual_seed(0)
    size, peak, per_size_s = 256, 0.0, budget_s / 4
    while True:
        a, b = (torch.randn(size, size, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
        best = _best_time(a, b, per_size_s)
        peak = max(peak, 2 * size ** 3 / best)
        if size >= n or best * 8 * 4 > per_size_s:  # the next size costs 8× more: keep ≥ 4 trials of it
            return peak
        size *= 2


def _best_time(a: torch.Tensor, b: torch.Tensor, budget_s: float, max_trials: int = 200) -> float:
    """The fastest of up to `max_trials` calls within `budget_s` (after one that picks and caches the kernel)."""
    _sync(a.device)
    a @ b
    _sync(a.device)
    best, start = float("inf"), time.perf_counter()
    for _ in range(max_trials):
        t0 = time.perf_counter()
        a @ b
        _sync(a.device)
        best = min(best, time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return best


def _device_label(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"{device.type}, {torch.get_num_threads()} threads"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
