"""torch.distributed glue: torchrun's environment, device choice, DDP/FSDP2 wrapping, agreed decisions.

Everything the training loop needs to not care whether it runs on 1 process or N.
"""
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from training.runtime.device import pick_device


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    cpu_group: object = None  # gloo group for host-side collectives when the main group is nccl

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple:
    """(rank, local_rank, world_size) as torchrun (or srun + torchrun) sets them; 1 process otherwise."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def process_info(device_name: str) -> DistInfo:
    """This process's rank, world size and device, from torchrun's environment — no collective yet,
    so slow per-process work (data preparation) can run before the group's timeout starts."""
    rank, local_rank, world_size = torchrun_env()
    device = pick_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return DistInfo(rank, local_rank, world_size, device)


def join(info: DistInfo, timeout_s: int) -> None:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) when WORLD_SIZE > 1."""
    if info.world_size == 1 or dist.is_initialized():
        return
    # The timeout turns a dead or stuck rank into an error on the others instead of a hang.
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend="nccl" if info.device.type == "cuda" else "gloo", timeout=timeout)
    # A gloo side channel for host-side flags (stop, signals): reading them never waits on the GPU.
    info.cpu_group = dist.new_group(backend="gloo", timeout=timeout) if info.device.type == "cuda" else None


class PeerLost(ValueError):
    """Another rank of the job died mid-run: this one cannot go on (one line, not gloo's traceback)."""


PEER_GONE = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed")


def peer_lost(error: BaseException, info: DistInfo):
    """What `error`, raised inside a collective, says of another rank being gone (its socket closed), or None."""
    return next((text for text in PEER_GONE if text in str(error)), None) if info.world_size > 1 else None


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def agree_max(values: list, info: DistInfo) -> list:
    """Element-wise max of small host integers over all ranks (e.g. [stop requested, signal number]).

    Every rank must take decisions such as "stop and save at this step" together: one rank in a
    save (collectives) while another starts the next step deadlocks until the timeout. Runs on
    the CPU (gloo), so reading the result never waits for queued GPU work.
    """
    if info.world_size == 1:
        return list(values)
    flags = torch.tensor(values, dtype=torch.int64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=info.cpu_group)
    return flags.tolist()


def broadcast_object(obj, info: DistInfo):
    """Rank 0's value of a small picklable object (e.g. the run directory) on every rank."""
    if info.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(obj, info: DistInfo) -> list:
    """[rank 0's obj, rank 1's, …] on every rank (small picklable objects, e.g. RNG states)."""
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
    if parallel not in ("auto", "none", "ddp", "fsdp"):
        raise ValueError(f"trainer.parallel={parallel!r} is unknown; choose auto, none, ddp or fsdp")
    if parallel == "auto" or world_size == 1:
        # One process has nothing to replicate or shard (e.g. resuming an FSDP run for a short fine-tune).
        return "ddp" if world_size > 1 else "none"
    if parallel == "none" and world_size > 1:
        raise ValueError(f"trainer.parallel=none with {world_size} processes would train {world_size} "
                         "independent models; use trainer.parallel=ddp or fsdp")
    return parallel


def wrap_model(module: torch.nn.Module, blocks, parallel: str, info: DistInfo, precision: str) -> torch.nn.Module:
    """DDP replicates `module`; FSDP2 shards every block, then the root (embedding, norm, head)."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        # forward_sync_buffers=False: the only buffers are the RoPE tables, derived from the config and
        # identical on every rank; re-broadcasting them before every forward is wasted traffic. (Its older
        # name, broadcast_buffers, prints a FutureWarning on every rank.)
        return DistributedDataParallel(module, device_ids=[info.device.index] if info.device.type == "cuda" else None,
                                       forward_sync_buffers=False)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = None
        if precision == "bf16" and info.device.type == "cuda":
            # bf16 compute and all-gathers, fp32 gradient reduction and fp32 sharded master weights.
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kwargs = {"mp_policy": mp} if mp is not None else {}
        for block in blocks:
            fully_shard(block, **kwargs)
        fully_shard(module, **kwargs)
    return module
