"""Mixed precision: bf16 autocast over fp32 master weights, or plain fp32 — and `auto`, which measures;
and TF32 for the fp32 matmuls of a CUDA device."""
import contextlib
import time
from typing import Optional

import torch

PRECISIONS = ("auto", "bf16", "fp32")


def resolve_precision(requested: str, device: torch.device) -> tuple:
    """(bf16 | fp32, why). `auto` takes bf16 only where this device runs bf16 matmuls fast.

    CPUs differ: with AMX or AVX512-BF16 a bf16 matmul is several times faster than fp32, but on
    an AVX2-only CPU oneDNN emulates it and it is ~100× SLOWER (1 vs 100 GFLOP/s measured on a
    2-core EPYC) — a bf16 default would turn a 10-minute run into a day. So measure, don't assume.
    """
    if requested not in PRECISIONS:
        raise ValueError(f"trainer.precision={requested!r} is unknown; choose auto, bf16 or fp32")
    if requested != "auto":
        return requested, "trainer.precision"
    if device.type == "cuda":
        if torch.cuda.is_bf16_supported():
            return "bf16", "CUDA device supports bf16"
        return "fp32", "this CUDA device has no bf16"
    if device.type != "cpu":
        return "fp32", f"bf16 autocast is not used on {device.type}"
    bf16, fp32 = (_matmul_seconds(dtype) for dtype in (torch.bfloat16, torch.float32))
    if bf16 < fp32:
        return "bf16", f"bf16 matmul {fp32 / bf16:.1f}× faster than fp32 on this CPU"
    return "fp32", f"bf16 matmul {bf16 / fp32:.0f}× slower than fp32 on this CPU (no AMX/AVX512-BF16)"


def resume_precision(requested: str, device: torch.device, trained_in: Optional[str], step: int) -> tuple:
    """(bf16 | fp32, why, warning or None) for a resume of a run that trained in `trained_in` up to `step`
    (None: its checkpoint predates state.json recording it, so `auto` measures as for a new run).

    Sessions move between machines, and `auto` alone would switch a run started in bf16 on a CPU with AMX
    to fp32 on an AVX2 one without a word: a run whose numerics change mid-way is no longer what an
    uninterrupted run computes, and a study comparing its cells would compare two precisions. So `auto`
    keeps the run's precision — except bf16 where this device would not choose it (an AVX2 CPU emulates
    it ~100× slower; a GPU without bf16 cannot run it), which continues in fp32 with a warning."""
    if trained_in not in ("bf16", "fp32"):
        return (*resolve_precision(requested, device), None)
    if requested == "auto" and trained_in == "fp32":
        return "fp32", "the run trained in fp32: a resume keeps it (trainer.precision=bf16 switches)", None
    precision, why = resolve_precision(requested, device)
    if precision == trained_in:
        return precision, (f"the run trained in {trained_in}: a resume keeps it; {why}" if requested == "auto"
                           else why), None
    because = f"trainer.precision={requested}" if requested != "auto" else f"{why}, so auto does not keep bf16"
    return precision, why, (f"warning: this run trained in {trained_in} up to step {step} and continues in "
                            f"{precision} ({because}): from here on it is not what an uninterrupted run computes"
                            + ("; trainer.precision=bf16 keeps bf16, slowly" if requested == "auto" else ""))


def _matmul_seconds(dtype: torch.dtype, n: int = 256, repeats: int = 3) -> float:
    """Best-of-N time of an n×n matmul: ~1 ms in fp32, ~25 ms in emulated bf16. Uses its own
    generator, so the training RNG stream is untouched (resume stays bitwise)."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(dtype) for _ in range(2))
    a @ b  # first call picks and caches the kernel
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


def autocast_context(precision: str, device: torch.device):
    """A zero-argument factory of autocast contexts for a resolved precision (bf16 | fp32).

    bf16 autocast runs matmuls in bf16 while parameters, gradients and optimizer state stay
    fp32, so small updates are not rounded away. bf16 has fp32's exponent range, so unlike
    fp16 no loss scaling is needed.
    """
    if precision == "fp32":
        return contextlib.nullcontext
    if precision != "bf16":
        raise ValueError(f"trainer.precision={precision!r} is unknown; choose auto, bf16 or fp32")
    if device.type == "mps":
        raise ValueError("trainer.precision=bf16 autocast is not supported on mps here; use trainer.precision=fp32")
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)


def enable_tf32(device: torch.device, enabled: bool = True) -> bool:
    """Let fp32 matmuls and convolutions use TF32 tensor cores on CUDA (fp32 range, 10-bit mantissa
    inputs, fp32 accumulation): ~8× an fp32 run's matmul speed on A100/H100 at no measurable cost to
    training (trainer.tf32; the MFU peak of an fp32 run assumes it). Returns whether TF32 is now on;
    no effect off CUDA. Uses torch's legacy switches, as everything else here does (torch refuses a
    mix of the legacy and the new fp32_precision API)."""
    if device.type != "cuda":
        return False
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled
    return enabled
