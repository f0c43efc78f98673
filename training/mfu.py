"""Peak matmul throughput per device, for model-FLOPs utilisation (MFU): looked up or measured."""
import time
from typing import Optional

import torch

# Dense bf16 tensor-core peaks from the vendors' data sheets (no sparsity), in FLOP/s.
GPU_BF16_PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12,
                  "L4": 121e12, "RTX 4090": 165e12, "RTX 3090": 71e12, "V100": 125e12}


def peak_flops(device: torch.device, precision: str, override_tflops: Optional[float] = None) -> tuple:
    """(FLOP/s, how it was obtained). Never a GPU's number for a CPU: CPUs are measured."""
    if override_tflops:
        return override_tflops * 1e12, "trainer.peak_tflops"
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, flops in GPU_BF16_PEAKS.items():
            if key in name:
                return (flops if precision == "bf16" else flops / 2), f"data sheet ({name})"
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    return measure_matmul_flops(device, dtype), f"measured {dtype} matmul on {device.type}"


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 8,
                         budget_s: float = 2.0) -> float:
    """Best-of-N square matmul throughput: an achievable peak for this device and thread count.

    The size grows from 256 up to `n` only while one matmul stays well inside the time budget:
    an emulated bf16 2048³ matmul takes ~20 s on an AVX2-only CPU, and a run's start-up must not.
    The operands come from a private generator, so measuring never moves the training RNG
    (a resumed run must draw exactly what the uninterrupted one drew).
    """
    gen = torch.Generator().manual_seed(0)
    size, best = 256, float("inf")
    while True:
        a, b = (torch.randn(size, size, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
        best = _best_time(a, b, repeats, budget_s)
        if size >= n or best * 8 * (repeats + 1) > budget_s:  # the next size costs 8× more
            return 2 * size ** 3 / best
        size *= 2


def _best_time(a: torch.Tensor, b: torch.Tensor, repeats: int, budget_s: float) -> float:
    best, start = float("inf"), time.perf_counter()
    for i in range(repeats + 1):
        _sync(a.device)
        t0 = time.perf_counter()
        a @ b
        _sync(a.device)
        if i:  # the first call picks and caches the kernel
            best = min(best, time.perf_counter() - t0)
        if i and time.perf_counter() - start > budget_s:
            break
    return best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
