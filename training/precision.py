"""Mixed precision: bf16 autocast over fp32 master weights, or plain fp32 — and `auto`, which measures;
and TF32 for the fp32 matmuls of a CUDA device."""
import contextlib
import math
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from training.runtime.cpu import CpuClass, cpu_class

PRECISIONS = ("auto", "bf16", "fp32")


# bf16 must measure at least this much faster than fp32 to be chosen: at parity bf16 only loses precision.
BF16_MARGIN = 1.2
# Each dtype's time is the CPU time of its best round of ROUNDS, fp32 and bf16 interleaved, on one thread. What
# is asked is how fast this CPU's kernels run bf16, and a busy machine must not change the answer: wall time
# with two threads counts every time slice another process takes, and a thread waiting for its descheduled
# partner. On a 2-core AMD EPYC with AVX512-BF16 (idle: bf16 2.2-2.4× faster), beside two busy processes, 40
# decisions measured 2.0-2.5× this way; two threads' wall time (best of 11 rounds) gave 1.1-4.2×, and fp32
# once in 40.
ROUNDS = 11
ROUND_S = 0.005  # each dtype's share of a round lasts at least this long: well above the clock's resolution
MAX_ROWS = 512  # the run's matmuls with at most this many rows (tokens): the shapes' kernels, not their length


@dataclass(frozen=True)
class Timing:
    """Seconds of one round of the run's matmuls in each dtype (its best round), and how it was measured."""
    bf16_s: float
    fp32_s: float
    what: str  # e.g. "the run's 4 matmul shapes, best of 11 interleaved rounds"

    @property
    def speedup(self) -> float:
        """How many times faster bf16 ran than fp32."""
        return self.fp32_s / self.bf16_s


def resolve_precision(requested: str, device: torch.device, shapes: Optional[Sequence[tuple]] = None) -> tuple:
    """(bf16 | fp32, why). `auto` takes bf16 only where this device runs the run's bf16 matmuls fast.

    On a CPU the class says what to expect (cpu.py: AMX and AVX512-BF16 run bf16 in hardware, ~2-4× fp32;
    an AVX2-only CPU has oneDNN emulate it, 40-100× slower), and a timing of the run's own matmul `shapes`
    ((rows, inner, outer) triples) decides: bf16 only at BF16_MARGIN× fp32's speed or more. The timing is
    needed: an AMX CPU capped to AVX512-BF16 runs bf16 *slower* than fp32, while an AMD one with
    AVX512-BF16 runs it 2.5× faster. The why names what the CPU reports and what was measured.
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
    cpu = cpu_class()
    return decide(cpu, measure(shapes or DEFAULT_SHAPES, full=cpu.bf16_in_hardware))


def decide(cpu: CpuClass, timing: Timing) -> tuple:
    """(bf16 | fp32, why) from what the CPU reports and what was measured."""
    if timing.speedup >= BF16_MARGIN:
        return "bf16", f"{cpu.describe()}; bf16 measured {timing.speedup:.1f}× faster than fp32 on {timing.what}"
    if timing.speedup >= 1:
        return "fp32", (f"{cpu.describe()}; bf16 measured only {timing.speedup:.2f}× as fast as fp32 on {timing.what}, "
                        f"below the {BF16_MARGIN}× that auto asks")
    emulated = "" if cpu.bf16_in_hardware else ": bf16 is emulated"
    return "fp32", f"{cpu.describe()}{emulated}; bf16 measured {1 / timing.speedup:.1f}× slower than fp32 on {timing.what}"


# The default model's matmuls (4,096 tokens; hidden 192, SwiGLU 512, vocab 4096): for callers without a model.
DEFAULT_SHAPES = ((4096, 192, 192), (4096, 192, 1024), (4096, 512, 192), (4096, 192, 4096))


def measure(shapes: Sequence[tuple], full: bool = True) -> Timing:
    """Time the matmuls `shapes` in fp32 and bf16, interleaved, on one thread, in CPU time. `full=False` (bf16
    emulated, where the run's shapes would take seconds) times one 256³ matmul per dtype instead: emulation
    shows at any size.
    Operands come from a private generator: the training RNG stream is untouched (resume stays bitwise)."""
    if not full:
        shapes, what = [(256, 256, 256)], "one 256³ matmul (the run's shapes would take seconds emulated)"
    else:
        shapes = [(min(m, MAX_ROWS), k, n) for m, k, n in dict.fromkeys(shapes)]
        what = f"the run's {len(shapes)} matmul shape{'s' * (len(shapes) > 1)}"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the calling thread does all the work, so its CPU time is the work's
    try:
        return _measure(shapes, what, full)
    finally:
        torch.set_num_threads(threads)


def _measure(shapes: list, what: str, full: bool) -> Timing:
    gen = torch.Generator().manual_seed(0)
    operands = {dtype: [(torch.randn(m, k, generator=gen).to(dtype), torch.randn(k, n, generator=gen).to(dtype))
                        for m, k, n in shapes] for dtype in (torch.float32, torch.bfloat16)}
    for dtype in operands:  # the first call picks and caches each kernel
        _run(operands[dtype], 1)
    repeats = {dtype: max(1, math.ceil(ROUND_S / max(_run(operands[dtype], 1), 1e-7))) for dtype in operands}
    if not full:
        repeats[torch.bfloat16] = 1  # one emulated matmul is already ~30 ms
    times = {dtype: [] for dtype in operands}
    for _ in range(ROUNDS if full else 3):
        for dtype in operands:
            times[dtype].append(_run(operands[dtype], repeats[dtype]) / repeats[dtype])
    rounds = len(times[torch.float32])
    return Timing(bf16_s=min(times[torch.bfloat16]), fp32_s=min(times[torch.float32]),
                  what=f"{what}, best of {rounds} interleaved rounds of one thread's CPU time")


def _run(pairs: list, repeats: int) -> float:
    """CPU seconds this thread spent on `repeats` rounds of the matmuls `pairs`: time descheduled is not counted."""
    start = time.thread_time()
    for _ in range(repeats):
        for a, b in pairs:
            a @ b
    return time.thread_time() - start


def resume_precision(requested: str, device: torch.device, trained_in: Optional[str], step: int,
                     shapes: Optional[Sequence[tuple]] = None) -> tuple:
    """(bf16 | fp32, why, warning or None) for a resume of a run that trained in `trained_in` up to `step`
    (None: its checkpoint predates state.json recording it, so `auto` measures as for a new run).

    Sessions move between machines, and `auto` alone would switch a run started in bf16 on a CPU with AMX
    to fp32 on an AVX2 one without a word: a run whose numerics change mid-way is no longer what an
    uninterrupted run computes, and a study comparing its cells would compare two precisions. So `auto`
    keeps the run's precision — except bf16 where this device would not choose it (an AVX2 CPU emulates
    it ~100× slower; a GPU without bf16 cannot run it), which continues in fp32 with a warning."""
    if trained_in not in ("bf16", "fp32"):
        return (*resolve_precision(requested, device, shapes), None)
    if requested == "auto" and trained_in == "fp32":
        return "fp32", "the run trained in fp32: a resume keeps it (trainer.precision=bf16 switches)", None
    precision, why = resolve_precision(requested, device, shapes)
    if precision == trained_in:
        return precision, (f"the run trained in {trained_in}: a resume keeps it; {why}" if requested == "auto"
                           else why), None
    because = f"trainer.precision={requested}" if requested != "auto" else f"{why}, so auto does not keep bf16"
    return precision, why, (f"warning: this run trained in {trained_in} up to step {step} and continues in "
                            f"{precision} ({because}): from here on it is not what an uninterrupted run computes"
                            + ("; trainer.precision=bf16 keeps bf16, slowly" if requested == "auto" else ""))


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
