"""The process and its place in the job: the device, torchrun's ranks and their agreed decisions, DDP/FSDP2, and the
signals that stop a run."""

import datetime
import os
import platform
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Tuple

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from training import Interrupted


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    cpu_group: object = None  # a gloo group for host-side flags when the main group is nccl

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(name: str, local_rank: int = 0, option: str = "trainer.device") -> torch.device:
    """auto prefers CUDA (this local rank's GPU), then MPS, then the CPU; a device this machine lacks is a ValueError."""
    mps = getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available()
    if name == "auto":
        return torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("mps" if mps else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"{option}={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps") from None
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"{option}={name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{option}={name} but CUDA is not available on this machine; use {option}=cpu")
        device = torch.device("cuda", local_rank) if device.index is None else device
        if device.index >= torch.cuda.device_count():
            raise ValueError(f"{option}={name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not mps:
        raise ValueError(f"{option}={name} but MPS is not available on this machine; use {option}=cpu")
    return device


def cpu_bf16(cap: Optional[str] = None) -> Tuple[bool, str]:
    """(whether this CPU runs bf16 matmuls in hardware, what it reports): AMX and AVX512-BF16 do; AVX2 emulates them,
    19–21× slower (BENCHMARKS.md). A ONEDNN_MAX_CPU_ISA cap below AVX512_CORE_BF16 counts as emulated."""
    x86 = platform.machine().lower() in ("x86_64", "amd64") and torch.cpu._is_avx2_supported()
    hardware = (
        "AMX-bf16"
        if x86 and torch.cpu._is_amx_tile_supported()
        else "AVX512-BF16"
        if x86 and torch.cpu._is_avx512_bf16_supported()
        else ""
    )
    cap = cap if cap is not None else os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    capped = (
        bool(hardware)
        and cap.upper() not in ("", "ALL", "DEFAULT")
        and not re.search(r"AMX|AVX512_CORE_(BF|FP)16|AVX10", cap.upper())
    )
    said = f"CPU reports {hardware or 'no AMX/AVX512-BF16'}" + (
        f", capped by ONEDNN_MAX_CPU_ISA={cap}" if capped else ""
    )
    return bool(hardware) and not capped, said


def bf16_fast(device: torch.device) -> Tuple[bool, str]:
    """(whether bf16 matmuls are fast on `device`, why): CUDA with bf16, or a CPU with bf16 in hardware."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "CUDA device supports bf16" if ok else "this CUDA device has no bf16"
    if device.type == "cpu":
        return cpu_bf16()
    return False, f"bf16 autocast is not used on {device.type}"


def compute_identity(device: torch.device) -> str:
    """What decides a step's rounding: torch's version and the kernels' target (state.json keeps it)."""
    if device.type == "cuda":
        return f"torch {torch.__version__}, cuda {torch.cuda.get_device_name(device)}"
    cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
    target = torch.backends.cpu.get_cpu_capability() if device.type == "cpu" else device.type
    return f"torch {torch.__version__}, {device.type} {target}" + (f", ONEDNN_MAX_CPU_ISA={cap}" if cap else "")


MEMINFO = Path("/proc/meminfo")
CGROUPS = (  # a container's limit, cgroup v2 then v1: (limit, usage, stat, the stat's reclaimable page cache)
    tuple(Path(f"/sys/fs/cgroup/memory.{name}") for name in ("max", "current", "stat")) + ("inactive_file",),
    tuple(Path(f"/sys/fs/cgroup/memory/memory.{name}") for name in ("limit_in_bytes", "usage_in_bytes", "stat"))
    + ("total_inactive_file",),
)


def size(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.0f} MiB"


def memory_room(own: int = 0) -> Tuple[Optional[int], str]:
    """(bytes, where from) a CPU process may still take: RAM available now, or its container's limit less what the
    container uses (less the page cache the kernel drops first, and `own`) when that is smaller."""
    found = (None, "unknown")
    for line in MEMINFO.read_text().splitlines() if MEMINFO.exists() else []:
        if line.startswith("MemAvailable:"):
            found = (int(line.split()[1]) * 1024, "available RAM now (/proc/meminfo)")
    for limit_file, usage_file, stat_file, cache_key in CGROUPS:
        try:
            text, used = limit_file.read_text().strip(), int(usage_file.read_text())
            limit = 2**63 if text == "max" else int(text)
            stat = dict(line.split() for line in stat_file.read_text().splitlines() if line.count(" ") == 1)
            used = max(used - int(stat.get(cache_key, 0)) - own, 0)
        except (OSError, ValueError):  # no such cgroup, or a file it cannot read: the host's RAM stands
            continue
        if limit < 2**60 and (found[0] is None or limit - used < found[0]):  # no limit: "max", or v1's 2^63
            found = (limit - used, f"the container's limit ({size(limit)}, {limit_file}) less {size(used)} used")
        break
    return found


def least_memory(model: torch.nn.Module, tokens: int, ranks: int = 1) -> int:
    """A lower bound on what training takes beyond the weights, over this host's `ranks`: a gradient and a moment per
    weight (8 bytes), and each block's saved inputs (2 norms', q, attention out, 2 MLP-wide) at 2 bytes a value."""
    cfg = model.cfg
    saved = 2 * tokens * cfg.n_layers * (4 * cfg.hidden_size + 2 * cfg.resolved_intermediate_size)
    return 8 * sum(p.numel() for p in model.parameters()) + ranks * saved


def check_cpu_memory(model: torch.nn.Module, tokens: int) -> None:
    """Refuse a run that cannot fit this host's memory before it starts: the kernel's kill leaves no line."""
    room, where = memory_room()
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))  # torchrun's processes on this host share its memory
    if room is not None and (need := least_memory(model, tokens, ranks)) > room:
        raise ValueError(
            f"this run needs at least {size(need)} more (gradients, optimizer state, activations) but "
            f"{where} leaves {size(room)}; lower trainer.micro_batch_size or the model's size, or give it "
            "more memory (scripts/estimate.py gives the whole estimate)"
        )


def process_info(device_name: str) -> DistInfo:
    """This process's rank, world size and device from torchrun's environment; no collective yet (see join)."""
    rank, local_rank, world = (
        int(os.environ.get(k, d)) for k, d in (("RANK", 0), ("LOCAL_RANK", 0), ("WORLD_SIZE", 1))
    )
    device = pick_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return DistInfo(rank, world, device)


def join(info: DistInfo, timeout_s: int) -> None:
    """Join torchrun's group (nccl on CUDA, gloo on CPU); the timeout turns a dead or stuck rank into an error."""
    if info.world_size == 1 or dist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend="nccl" if info.device.type == "cuda" else "gloo", timeout=timeout)
    # A gloo side channel for host-side flags: reading them never waits on the GPU.
    info.cpu_group = dist.new_group(backend="gloo", timeout=timeout) if info.device.type == "cuda" else None


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


class PeerLost(ValueError):
    """Another rank died mid-run: this one cannot go on (one line, not gloo's traceback)."""


def peer_lost(error: BaseException, info: DistInfo) -> Optional[str]:
    """What `error`, raised inside a collective, says of another rank being gone, or None."""
    gone = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed")
    return next((text for text in gone if text in str(error)), None) if info.world_size > 1 else None


def agree_max(values: list, info: DistInfo) -> list:
    """Element-wise max of small host integers over all ranks, on gloo: never waits on queued GPU work."""
    if info.world_size == 1:
        return list(values)
    flags = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=info.cpu_group)
    return flags.tolist()


def broadcast_object(obj, info: DistInfo):
    if info.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj, info: DistInfo) -> list:
    """[rank 0's obj, rank 1's, …] on every rank (small picklable objects: RNG states)."""
    if info.world_size == 1:
        return [obj]
    out = [None] * info.world_size
    dist.all_gather_object(out, obj, group=info.cpu_group)
    return out


def all_reduce_mean(value: torch.Tensor, info: DistInfo) -> torch.Tensor:
    if info.world_size > 1:
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= info.world_size
    return value


def resolve_parallel(parallel: str, world_size: int) -> str:
    if parallel == "none" and world_size > 1:
        raise ValueError(
            f"trainer.parallel=none with {world_size} processes would train {world_size} independent "
            "models; use trainer.parallel=ddp or fsdp"
        )
    if parallel == "auto" or world_size == 1:  # one process has nothing to replicate or shard
        return "ddp" if world_size > 1 else "none"
    return parallel


def wrap_model(module: torch.nn.Module, blocks, parallel: str, info: DistInfo, precision: str) -> torch.nn.Module:
    """DDP replicates `module`; FSDP2 shards every block, then the root (embedding, norm, head)."""
    if parallel == "ddp":
        # The only buffers are RoPE's tables, derived from the config: re-broadcasting them each forward is waste.
        return DistributedDataParallel(
            module, device_ids=[info.device.index] if info.device.type == "cuda" else None, forward_sync_buffers=False
        )
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # tests patch the module's fully_shard

        kwargs = {}
        if precision == "bf16" and info.device.type == "cuda":  # bf16 compute and gathers, fp32 reduction and masters
            kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(module, **kwargs)
    return module


# ---- signals: SIGINT/SIGTERM checkpoint and exit at a step boundary; a second one stops at once --------------------


class StoppedNow(Interrupted):
    """A second signal: leave now, without a checkpoint (a KeyboardInterrupt: no `except Exception` swallows it)."""


class StopFlag:
    """Records the first SIGINT/SIGTERM; the loop reads it at step boundaries, agreed across ranks."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.signum is not None:  # a second Ctrl-C means "now", not "after the checkpoint"
            raise StoppedNow(signum)
        self.signum = signum

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def peer_lost(self) -> None:
        """Another rank died and torchrun will SIGTERM this one: ignored from here, so the `error:` line gets out."""
        self.restore()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
