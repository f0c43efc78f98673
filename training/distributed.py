"""torch.distributed glue: torchrun's environment, device choice, DDP/FSDP2 wrapping, full state dicts.

Everything the training loop needs to not care whether it runs on 1 process or N.
"""
import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     get_optimizer_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)


@dataclass
class DistInfo:
    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def torchrun_env() -> tuple:
    """(rank, local_rank, world_size) as torchrun (or srun + torchrun) sets them; 1 process otherwise."""
    return int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def pick_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", local_rank)
        if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise ValueError(f"trainer.device={name!r} is not a device; use auto, cpu, cuda, cuda:N or mps")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("trainer.device=cuda but CUDA is not available here; use trainer.device=cpu")
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)  # one GPU per local rank under torchrun
    if device.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"trainer.device={name!r} is not supported; use auto, cpu, cuda, cuda:N or mps")
    return device


def setup(device_name: str, timeout_s: int) -> DistInfo:
    """Join torchrun's process group (nccl on CUDA, gloo on CPU) when WORLD_SIZE > 1."""
    rank, local_rank, world_size = torchrun_env()
    device = pick_device(device_name, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if world_size > 1 and not dist.is_initialized():
        # The timeout turns a dead or stuck rank into an error on the others instead of a hang.
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo",
                                timeout=datetime.timedelta(seconds=timeout_s))
    return DistInfo(rank, local_rank, world_size, device)


def teardown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(info: DistInfo) -> None:
    if info.world_size > 1:
        dist.barrier()


def broadcast_object(obj, info: DistInfo):
    """Rank 0's value of a small picklable object (e.g. the run directory) on every rank."""
    if info.world_size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


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


def wrap_model(model: torch.nn.Module, parallel: str, info: DistInfo, precision: str) -> torch.nn.Module:
    """DDP replicates the model; FSDP2 shards every block, then the root (embedding, norm, head)."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[info.device.index] if info.device.type == "cuda" else None)
    if parallel == "fsdp":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        mp = None
        if precision == "bf16" and info.device.type == "cuda":
            # bf16 compute and all-gathers, fp32 gradient reduction and fp32 sharded master weights.
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        kwargs = {"mp_policy": mp} if mp is not None else {}
        for block in model.layers:
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
    return model


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: torch.nn.Module) -> dict:
    """The unwrapped, unsharded state dict (collective under FSDP: call on every rank)."""
    return get_model_state_dict(model, options=_FULL)


def full_optimizer_state(model: torch.nn.Module, optimizers: list) -> dict:
    """Optimizer state keyed by parameter name, so it loads at any world size (collective too).
    Several optimizers (e.g. Muon + AdamW) merge into one dict: each parameter belongs to one."""
    return get_optimizer_state_dict(model, optimizers, options=_FULL)


def load_full_state(model: torch.nn.Module, optimizers, model_state: dict, optim_state) -> None:
    opts = StateDictOptions(full_state_dict=True, broadcast_from_rank0=False)
    set_model_state_dict(model, model_state, options=opts)
    if optimizers is not None and optim_state is not None:
        set_optimizer_state_dict(model, optimizers, optim_state, options=opts)
