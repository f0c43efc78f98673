"""Peak memory of a training step: measured (CUDA's max allocated, or the CPU process's max RSS), or
simulated on fake tensors before a run (scripts/estimate.py)."""
import contextlib
import resource
import sys
from dataclasses import dataclass
from typing import Callable

import torch


def peak_memory_bytes(device: torch.device) -> int:
    """The most memory held so far (since start, or the last reset_peak_memory).

    CUDA: bytes the caching allocator handed to tensors at its peak (not what it reserved: that
    includes its cache, which is free to reuse). CPU: the process's maximum resident set size —
    everything, Python and libraries included, so compare differences, not absolute values.
    """
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def current_memory_bytes(device: torch.device) -> int:
    """Memory held now: CUDA allocated bytes, or the process's resident set size (0 where unknown)."""
    if device.type == "cuda":
        return torch.cuda.memory_allocated(device)
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak from the current usage; False where the platform cannot (non-Linux CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:
        # Linux: "5" resets the peak RSS (VmHWM, and with it getrusage's ru_maxrss) to the current RSS.
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def memory_kind(device: torch.device) -> str:
    """What peak_memory_bytes measures, for a summary line."""
    return "CUDA max allocated" if device.type == "cuda" else "process max RSS"


@dataclass
class StepMemory:
    """Bytes at the peak of a simulated training step, by kind (what the step's peak is made of)."""
    weights: int  # parameters (the master copy, in their dtype)
    buffers: int
    gradients: int
    optimizer: int  # optimizer state (AdamW: two moments)
    activations: int  # tensors saved for backward and temporaries alive at the peak, logits included
    peak: int  # their sum: the step's peak


def simulate_step_memory(build: Callable[[], tuple], batch_shape: tuple, vocab_size: int, accum: int = 1,
                         autocast: Callable = contextlib.nullcontext) -> StepMemory:
    """Peak memory of one training step of `build()`'s (loss_module, optimizers), without allocating it.

    Everything runs on fake tensors (shapes and dtypes only) under torch's MemTracker, which records
    live storages op by op, so what is counted is exactly what this code saves for backward and
    allocates, autocast casts included. Not modelled: the allocator's fragmentation and cache, the
    CUDA context, collectives' buffers. Takes seconds (~5 s for 125m at 32 × 1024 on one AMD EPYC core).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        loss_module, optimizers = build()
        inputs, targets = (torch.randint(0, vocab_size, batch_shape) for _ in range(2))

        def micro_step():
            with autocast():
                loss = loss_module(inputs, targets) / accum
            loss.backward()

        def update():
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        # Every step but the first finds the optimizer state in place, and with grad accumulation every
        # micro-step but the first adds to existing gradients: create both without running the model.
        for p in loss_module.parameters():
            p.grad = torch.zeros_like(p)
        for optimizer in optimizers:
            optimizer.step()
            if accum == 1:
                optimizer.zero_grad(set_to_none=True)
        tracker = _peak_tracker()
        tracker.track_external(loss_module, *optimizers)
        with tracker:
            micro_step()
            update()
        snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
    kinds = {kind.name: n for kind, n in snap.items() if kind != "Total"}  # the kinds are str enums
    # ACT: saved by the forward; TEMP: backward's temporaries (gradients of activations, of logits).
    return StepMemory(weights=kinds.get("PARAM", 0), buffers=kinds.get("BUFFER", 0), gradients=kinds.get("GRAD", 0),
                      optimizer=kinds.get("OPT", 0), activations=kinds.get("ACT", 0) + kinds.get("TEMP", 0)
                      + kinds.get("OTH", 0), peak=snap["Total"])


def _peak_tracker():
    """torch's MemTracker (private, in torch since 2.5) keeping only the whole step's peak. Its own update after
    every op also refreshes the peak of each module being run — a walk over every module tracked so far, about
    two thirds of the simulation's time for the 125m model — and only the step's peak is read here."""
    from copy import deepcopy

    from torch.distributed._tools.mem_tracker import MemTracker

    class PeakTracker(MemTracker):
        def _update_peak_stats(self, peak_state) -> None:
            for device, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(device, 0) < snap["Total"]:
                    self._peak_mem[device] = snap["Total"]
                    self._peak_mem_snap[device] = deepcopy(snap)

    return PeakTracker()
