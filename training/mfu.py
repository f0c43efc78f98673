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


def measure_matmul_flops(device: torch.device, dtype: torch.dtype, n: int = 2048, repeats: int = 8) -> float:
    """Best-of-N square matmul throughput: an achievable peak for this device and thread count."""
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(repeats + 2):
        _sync(device)
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n ** 3 / best


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
