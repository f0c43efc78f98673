"""The benchmarks behind `python -m dev.bench NAME`, one module each, and what they share: the stopwatch, the
machine's description and its matmul peak (torch imported inside them: `import dev.bench` stays light)."""

import platform
import re
import time
from pathlib import Path


def timed(fn) -> float:
    """Seconds one call of fn takes (wall clock): the benchmarks' one stopwatch."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def machine() -> str:
    """The CPU's model and bf16 class, threads, torch and the date: the line every benchmark's numbers go with."""
    import torch

    from training.distributed import cpu_bf16

    info = Path("/proc/cpuinfo")
    found = re.search(r"^model name\s*:\s*(.+)$", info.read_text(), re.M) if info.exists() else None
    cpu = found.group(1) if found else platform.processor() or platform.machine()
    return (
        f"{time.strftime('%Y-%m-%d')}, {cpu} ({cpu_bf16()[1]}), {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}"
    )


_MEASURED = {}


def measure_matmul_flops(device, dtype, n: int = 2048, budget_s: float = 1.0) -> float:
    """The highest square-matmul throughput this device and thread count reach, once per process and setting: the best
    over sizes 256, 512, … up to n, many short trials each (one 2048³ matmul on a CPU is almost always cut by another
    process's time slice; among dozens of 1-5 ms ones some run untouched). Operands from a private generator."""
    import torch

    key = (str(device), dtype, n, budget_s, torch.get_num_threads())
    if key in _MEASURED:
        return _MEASURED[key]
    sync = (lambda: torch.cuda.synchronize(device)) if torch.device(device).type == "cuda" else (lambda: None)
    gen, size, peak = torch.Generator().manual_seed(0), 256, 0.0
    while True:
        a, b = (torch.randn(size, size, generator=gen).to(device=device, dtype=dtype) for _ in range(2))
        a @ b  # picks and caches the kernel
        sync()
        best, start = float("inf"), time.perf_counter()
        for _ in range(200):
            best = min(best, timed(lambda: (a @ b, sync())))
            if time.perf_counter() - start > budget_s / 4:
                break
        peak = max(peak, 2 * size**3 / best)
        if size >= n or best * 32 > budget_s / 4:  # the next size costs 8× more: keep >= 4 trials of it
            _MEASURED[key] = peak
            return peak
        size *= 2
