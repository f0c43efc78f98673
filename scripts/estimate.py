"""Know before you launch: parameters, memory, FLOPs and time per step of a training config, and whether it fits.

Usage: python scripts/estimate.py [overrides as for train.py ...] [--device cpu|cuda] [--device-memory-gb G]
           [--world-size N] [--peak-tflops T] [--mfu F | --mfu-from RUN_DIR] [--measure]
e.g.   python scripts/estimate.py model=125m trainer=gpu data.vocab_size=32768 --device cuda --device-memory-gb 80
Memory is simulated: one training step of the real code on fake tensors (shapes only, nothing allocated).
--measure also runs real fp32 steps on this CPU and compares their peak live tensor memory with the estimate.
"""

import argparse
import contextlib
import math
import re
import resource
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)
import torch
from omegaconf import OmegaConf

from model import Transformer
from training import distributed as D
from training.checkpoint import METRICS, RunFiles
from training.log import gpu_peak, peak_flops, read_metrics
from training.loop import CausalLMLoss, autocast_context, resolve_precision
from training.optim import build_optimizers
from training.program import compose_run_config, description, run

GiB, MiB = 2**30, 2**20
CUDA_OVERHEAD = 1 * GiB  # CUDA context, cuBLAS workspaces, allocator slack: not tensors, still memory
# glibc keeps freed blocks below its 32 MiB mmap threshold in the heap, and oneDNN keeps scratch
# buffers, so a CPU process's peak RSS sits above its live tensors: +10-25 % on one 2-core machine,
# +65 % for the default model at micro-batch 8 on another (the CI machine). Allow for the worse.
CPU_ALLOCATOR_SLACK = 0.75  # of the activations
HEADROOM = 0.95  # fit within 95 % of the device: allocator fragmentation needs some room


def gpu_memory_bytes(device_name: str):
    """This GPU's memory from its name ("A100 SXM4 40GB": 40 GB) or its data sheet (H100 SXM: 80 GB), in bytes (1 GB =
    1e9: at or under what torch reports); None when neither says."""
    sheet = gpu_peak(device_name)
    if sheet is None:
        return None
    named = re.search(r"(\d+)\s*gb", device_name.lower())
    gb = float(named.group(1)) if named else sheet[3]
    return gb * 1e9 if gb else None


def current_memory_bytes() -> int:
    """This process's resident set size now (0 where unknown): a CPU run's runtime; a CUDA one's is CUDA_OVERHEAD."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return 0


@dataclass
class StepMemory:
    """Bytes at the peak of a simulated training step, by kind (what the step's peak is made of)."""

    weights: int  # parameters (the master copy, in their dtype)
    buffers: int
    gradients: int
    optimizer: int  # optimizer state (AdamW: two moments)
    activations: int  # tensors saved for backward and temporaries alive at the peak, logits included
    peak: int  # their sum: the step's peak


def simulate(cfg, precision: str, chunk_above="auto", fake: bool = True) -> StepMemory:
    """Peak memory of one training step (not the first) of the CausalLMLoss and optimizers train.py builds (chunk_above
    as CausalLMLoss takes it: "auto" is train.py's threshold, None one-shot, 0 always chunked): torch's MemTracker
    records live storages op by op, autocast casts included; on fake tensors (shapes only, nothing allocated), or for
    real after a real first step (fake=False: --measure). Not modelled: the allocator's cache, the CUDA context."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    t, autocast = cfg.trainer, autocast_context(precision, torch.device("cpu"))
    accum = t.grad_accum_steps
    with FakeTensorMode() if fake else contextlib.nullcontext():
        loss_module = CausalLMLoss(Transformer(cfg.model), chunk_above=chunk_above)
        optimizers = build_optimizers(loss_module, cfg.optim, "cpu")
        inputs, targets = (torch.randint(0, cfg.model.vocab_size, (t.micro_batch_size, t.seq_len)) for _ in range(2))

        def micro_step():
            with autocast():
                loss = loss_module(inputs, targets) / accum
            loss.backward()

        def update():
            for optimizer in optimizers:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        micro_steps = 1 if fake else accum
        if fake:  # the optimizer state and, with accumulation, the gradients a later micro-step finds: no model run
            for p in loss_module.parameters():
                p.grad = torch.zeros_like(p)
            for optimizer in optimizers:
                optimizer.step()
                if accum == 1:
                    optimizer.zero_grad(set_to_none=True)
        else:  # a real first step creates the optimizer state
            for _ in range(accum):
                micro_step()
            update()
        tracker = _peak_tracker()
        tracker.track_external(loss_module, *optimizers)
        with tracker:
            for _ in range(micro_steps):
                micro_step()
            update()
        snap = next(iter(tracker.get_tracker_snapshot("peak").values()))
    kinds = {kind.name: n for kind, n in snap.items() if kind != "Total"}  # the kinds are str enums
    # ACT: saved by the forward; TEMP: backward's temporaries (gradients of activations, of logits).
    return StepMemory(
        weights=kinds.get("PARAM", 0),
        buffers=kinds.get("BUFFER", 0),
        gradients=kinds.get("GRAD", 0),
        optimizer=kinds.get("OPT", 0),
        activations=kinds.get("ACT", 0) + kinds.get("TEMP", 0) + kinds.get("OTH", 0),
        peak=snap["Total"],
    )


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


def parse_args(argv) -> tuple:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("--device", choices=("cpu", "cuda"), help="the target (default: trainer.device, auto = here)")
    p.add_argument("--device-memory-gb", type=float, help="the device's memory (default: detected)")
    p.add_argument("--world-size", type=int, default=1, help="processes (GPUs) the run will use")
    p.add_argument(
        "--peak-tflops", type=float, help="matmul peak (default: trainer.peak_tflops, else looked up/measured)"
    )
    p.add_argument("--gpu", help="take the peak from this GPU's data sheet, e.g. 'NVIDIA H100 80GB HBM3'")
    p.add_argument("--mfu", type=float, help="model-FLOPs utilisation to assume, e.g. 0.4")
    p.add_argument("--mfu-from", metavar="RUN_DIR", help="take the MFU measured by this run (its metrics.jsonl)")
    p.add_argument("--measure", action="store_true", help="also measure two real steps on this CPU (fp32)")
    args, overrides = p.parse_known_args(argv)
    bad = [o for o in overrides if o.startswith("-") or "=" not in o]
    if bad:
        raise ValueError(f"unrecognised argument {bad[0]!r}: see --help; overrides look like key=value")
    for ok, message in (
        (args.world_size >= 1, f"--world-size {args.world_size} must be >= 1"),
        (args.mfu is None or 0 < args.mfu <= 1, f"--mfu {args.mfu} must be a fraction in (0, 1], e.g. 0.4"),
        (
            args.device_memory_gb is None or args.device_memory_gb > 0,
            f"--device-memory-gb {args.device_memory_gb} must be > 0",
        ),
        (args.peak_tflops is None or args.peak_tflops > 0, f"--peak-tflops {args.peak_tflops} must be > 0"),
    ):
        if not ok:
            raise ValueError(message)
    if args.mfu_from and not RunFiles(args.mfu_from).metrics.is_file():
        raise ValueError(f"--mfu-from {args.mfu_from}: no metrics.jsonl there; pass a run directory")
    return args, overrides


def per_device(mem: StepMemory, parallel: str, world: int) -> dict:
    """Bytes per device by kind. FSDP shards weights, gradients and optimizer state; DDP keeps full
    copies plus gradient buckets of the same size (gradient_as_bucket_view is off)."""
    parts = {
        "weights": mem.weights + mem.buffers,
        "gradients": mem.gradients,
        "optimizer state": mem.optimizer,
        "activations (peak, incl. logits)": mem.activations,
    }
    if parallel == "fsdp" and world > 1:
        for kind in ("weights", "gradients", "optimizer state"):
            parts[kind] = math.ceil(parts[kind] / world)
    if parallel == "ddp" and world > 1:
        parts["DDP gradient buckets"] = mem.weights
    return parts


def device_memory(args, device: torch.device) -> tuple:
    """(bytes, where the number comes from) or (None, why not)."""
    if args.device_memory_gb:
        return args.device_memory_gb * 1e9, "--device-memory-gb"
    if args.gpu:
        named = gpu_memory_bytes(args.gpu)
        if named is not None:
            return named, f"data sheet: {args.gpu}"
        if gpu_peak(args.gpu) is not None:
            return (
                None,
                f"unknown: {args.gpu} comes with several memory sizes; name it (e.g. '… 80GB') or pass --device-memory-gb",
            )
    if device.type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(device)
        return props.total_memory, props.name
    if device.type == "cpu":
        return cpu_memory()
    return None, "unknown: pass --device-memory-gb"


def cpu_memory() -> tuple:
    """(bytes, where from): what this process may take (training/distributed.py memory_room), less its own runtime,
    which the verdict adds: the host's RAM says nothing of a process the kernel kills at its cgroup's limit."""
    room, where = D.memory_room(own=current_memory_bytes())
    return (room, where) if room is not None else (None, "unknown: pass --device-memory-gb")


def measured_mfu(args, cfg) -> tuple:
    """(MFU, where from): given, from --mfu-from's metrics.jsonl, or from the newest run of the same model."""
    if args.mfu:
        return args.mfu, "--mfu"
    runs = (
        [Path(args.mfu_from)]
        if args.mfu_from
        else sorted(
            (p.parent for p in Path(cfg.outputs_dir).glob(f"*/*/{METRICS}")),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
    )
    want = OmegaConf.to_container(OmegaConf.structured(cfg.model))
    for run_dir in runs:
        try:
            if (
                not args.mfu_from
                and OmegaConf.to_container(OmegaConf.load(RunFiles(run_dir).config)).get("model") != want
            ):
                continue
            rows = read_metrics(RunFiles(run_dir).metrics, warn=lambda message: None)  # a cut-off last row: the rest
        except (OSError, ValueError):
            continue
        values = [r["mfu"] for r in rows if r.get("kind") == "train" and r.get("mfu")]
        if values:  # the second half: the first intervals include compilation and warm-up
            return statistics.median(values[len(values) // 2 :]), f"median of {run_dir}/metrics.jsonl"
    if args.mfu_from:
        raise ValueError(f"--mfu-from {args.mfu_from}: its metrics.jsonl has no train rows with an mfu")
    return None, "no run of this model found; pass --mfu or --mfu-from"


def fmt(n: float) -> str:
    return f"{n / GiB:,.2f} GiB" if n >= GiB else f"{n / MiB:,.1f} MiB"


def target(args, cfg) -> tuple:
    """(device, precision, why): where the run will go and what precision `auto` gives there."""
    name = args.device or cfg.trainer.device
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device("cuda", 0) if name.startswith("cuda") else torch.device("cpu")
    if device.type == "cuda" and not torch.cuda.is_available():
        if cfg.trainer.precision == "auto":
            return device, "bf16", "assumed for a CUDA target (no GPU here to ask)"
        return device, cfg.trainer.precision, "trainer.precision"
    return (device, *resolve_precision(cfg.trainer.precision, device))


def fit_verdict(parts: dict, runtime: int, slack: float, memory, micro_batch: int, accum: int) -> str:
    """Fits or not, and the largest micro-batch that would: activations (and the allocator's slack on
    them) grow with it, weights, gradients, optimizer state and the runtime do not."""
    activations = parts["activations (peak, incl. logits)"] * (1 + slack)
    fixed = sum(parts.values()) - parts["activations (peak, incl. logits)"] + runtime
    need = fixed + activations
    extra = f"incl. {fmt(runtime)} runtime" + (
        f" and {fmt(activations - parts['activations (peak, incl. logits)'])} allocator cache" if slack else ""
    )
    if memory is None:
        return f"needs {fmt(need)} ({extra}); device memory unknown: pass --device-memory-gb"
    room = HEADROOM * memory - fixed
    largest = int(room // (activations / micro_batch)) if room > 0 else 0
    if need <= HEADROOM * memory:
        return (
            f"fits: needs {fmt(need)} of {fmt(memory)} ({100 * need / memory:.0f} %, {extra}); "
            f"the largest micro_batch_size that would fit is about {largest}"
        )
    if largest < 1:
        return (
            f"does NOT fit: needs {fmt(need)} of {fmt(memory)}, {fmt(fixed)} before any activations; use "
            "FSDP over more devices (--world-size with trainer.parallel=fsdp) or a smaller model"
        )
    return (
        f"does NOT fit: needs {fmt(need)} of {fmt(memory)} ({extra}); try trainer.micro_batch_size={largest} "
        f"trainer.grad_accum_steps={math.ceil(accum * micro_batch / largest)} (about the same tokens per step)"
    )


def report(args, cfg) -> None:
    device, precision, why = target(args, cfg)
    peak = resolve_peak(args, cfg, device, precision)  # first: a bad --gpu fails before any output
    t, world = cfg.trainer, args.world_size
    parallel = t.parallel if t.parallel != "auto" else ("ddp" if world > 1 else "none")
    with torch.device("meta"):  # sizes only
        model = Transformer(cfg.model)
    counts, flops = model.param_counts(), model.token_flops(t.seq_len)
    loss = CausalLMLoss(model)  # the loss train.py builds: chunked above its default threshold
    chunked = loss.chunk_tokens(t.micro_batch_size * t.seq_len, cfg.model.padded_vocab_size) is not None
    mem = simulate(cfg, precision)
    other = simulate(cfg, precision, None if chunked else 0)  # the other loss path, for comparison
    parts = per_device(mem, parallel, world)
    tokens = t.micro_batch_size * t.seq_len * t.grad_accum_steps * world
    logits = t.micro_batch_size * t.seq_len * cfg.model.padded_vocab_size * 4
    print(
        f"model: {cfg.model.hidden_size} hidden × {cfg.model.depth}, {cfg.model.n_heads} heads "
        f"({cfg.model.resolved_n_kv_heads} kv), vocab {cfg.model.padded_vocab_size}: {counts['total']:,} parameters "
        f"(embedding {counts['embedding']:,}, attention {counts['attention']:,}, mlp {counts['mlp']:,})"
    )
    print(
        f"step: {t.micro_batch_size} × {t.seq_len} tokens × {t.grad_accum_steps} accumulation × {world} "
        f"processes = {tokens:,} tokens; {device.type}, {precision} ({why}), parallel={parallel}"
    )
    print(f"\nmemory per device at the step's peak (simulated on fake tensors; optimizer {cfg.optim.name}):")
    for kind, n in parts.items():
        print(f"  {kind:<34}{fmt(n):>12}")
    saving = other.peak - mem.peak if chunked else mem.peak - other.peak
    print(
        f"  logits: one fp32 copy is {fmt(logits)}; the loss is {'chunked' if chunked else 'one-shot'} "
        f"(B·T·vocab {t.micro_batch_size * t.seq_len * cfg.model.padded_vocab_size:,} vs threshold "
        f"{loss.chunk_above}); chunked {'saves' if saving >= 0 else 'costs'} {fmt(abs(saving))} here"
    )
    runtime = CUDA_OVERHEAD if device.type == "cuda" else current_memory_bytes()
    slack = 0.0 if device.type == "cuda" else CPU_ALLOCATOR_SLACK
    memory, source = device_memory(args, device)
    print(
        f"  {'total (tensors)':<34}{fmt(sum(parts.values())):>12}  (device: {fmt(memory) if memory else '?'}, {source})"
    )
    print(f"verdict: {fit_verdict(parts, runtime, slack, memory, t.micro_batch_size, t.grad_accum_steps)}")
    print_time(args, cfg, peak, flops, tokens, world)


def resolve_peak(args, cfg, device, precision) -> tuple:
    """(FLOP/s, source) per device: --peak-tflops or trainer.peak_tflops, --gpu's data sheet, or this device's."""
    override = args.peak_tflops or cfg.trainer.peak_tflops
    sheet = gpu_peak(args.gpu) if args.gpu else None
    if args.gpu and sheet is None:
        raise ValueError(f"--gpu {args.gpu!r} is not in training/log.py's table; pass --peak-tflops instead")
    if sheet is not None and not override:
        return (sheet[1] if precision == "bf16" else sheet[2]), f"data sheet: {sheet[0]}"
    if device.type == "cuda" and not torch.cuda.is_available() and not override:
        return None, "no GPU here to look up or measure its peak; pass --gpu NAME or --peak-tflops"
    return peak_flops(device, precision, override)


def print_time(args, cfg, peak: tuple, flops, tokens: int, world: int) -> None:
    weights, attention = flops
    per_step = (weights + attention) * tokens
    print(
        f"\nFLOPs: {(weights + attention) / 1e6:,.2f} M per token (weights {weights / 1e6:,.2f} M + causal attention "
        f"{attention / 1e6:,.2f} M) × {tokens:,} tokens = {per_step / 1e12:,.3f} TFLOP per step"
    )
    if peak[0] is None:
        print(f"time: {peak[1]}")
        return
    mfu, mfu_source = measured_mfu(args, cfg)
    ideal = per_step / (peak[0] * world)
    print(f"time per step at {peak[0] / 1e12:,.2f} TFLOP/s per device ({peak[1]}): {ideal:,.2f} s at 100 % MFU")
    if mfu:
        seconds = ideal / mfu
        steps = cfg.trainer.max_steps
        total = f", {seconds * steps / 3600:,.2f} h of steps for trainer.max_steps={steps}" if steps else ""
        print(f"  at MFU {100 * mfu:.1f} % ({mfu_source}): {seconds:,.2f} s per step{total}")
    else:
        print(f"  MFU: {mfu_source}")


def compare_with_measurement(cfg) -> None:
    """The simulated step's peak above the model against the same step run for real on this CPU: live tensors, which
    unlike RSS hold no oneDNN scratch or glibc cache of freed blocks."""
    mem = simulate(cfg, "fp32")
    torch.manual_seed(0)
    real = simulate(cfg, "fp32", fake=False)
    estimated, measured = (m.peak - m.weights - m.buffers for m in (mem, real))
    print(
        f"\nmeasured on this CPU (fp32, one step after the first, live tensors by torch's MemTracker): "
        f"{fmt(measured)} above the model; the estimate {fmt(estimated)} ({100 * (estimated / measured - 1):+.0f} %)"
    )


def main(argv=None) -> int:
    args, overrides = parse_args(sys.argv[1:] if argv is None else argv)
    report(args, compose_run_config(overrides))
    if args.measure:
        compare_with_measurement(compose_run_config([*overrides, "trainer.precision=fp32", "trainer.device=cpu"]))
    return 0


if __name__ == "__main__":
    run(main)
