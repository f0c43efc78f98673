"""One optimizer step, checked before it is committed: a non-finite loss or gradient never reaches the weights.

The check runs on the device. With fused AdamW the flag goes straight into the kernel (`found_inf`,
the mechanism GradScaler uses), which then leaves weights, moments and step counts untouched — no
host sync. Other optimizers (Muon, foreach/plain AdamW) need a host check; on a CPU that costs
nothing, on a GPU it is one sync per step. The loop reads the record once per log interval.
"""
import contextlib
from dataclasses import dataclass

import torch


@dataclass
class NonFiniteRecord:
    """Device-side counters of skipped (non-finite) steps since the last `read()`."""
    skipped: torch.Tensor  # steps skipped in this interval
    streak: torch.Tensor  # consecutive skipped steps up to now (carries over intervals)
    max_streak: torch.Tensor  # longest streak seen in this interval
    first_bad: torch.Tensor  # first skipped step of the interval, -1 if none

    @classmethod
    def on(cls, device: torch.device) -> "NonFiniteRecord":
        zero = lambda v=0: torch.tensor(v, device=device, dtype=torch.int64)  # noqa: E731
        return cls(zero(), zero(), zero(), zero(-1))

    def update(self, finite: torch.Tensor, step: int) -> None:
        bad = (~finite).long()
        self.skipped += bad
        self.streak.add_(1).mul_(bad)  # +1 on a bad step, back to 0 on a good one
        torch.maximum(self.max_streak, self.streak, out=self.max_streak)
        self.first_bad.copy_(torch.where((self.first_bad < 0) & (bad > 0), step, self.first_bad))

    def read(self) -> dict:
        """Host values (note: a CPU-GPU sync point — the loop calls it once per log interval)."""
        values = torch.stack([self.skipped, self.streak, self.max_streak, self.first_bad]).tolist()
        self.skipped.zero_()
        self.max_streak.copy_(self.streak)
        self.first_bad.fill_(-1)
        return dict(zip(("skipped", "streak", "max_streak", "first_bad"), values))


def train_step(loss_module, batches, step: int, accum: int, grad_clip: float, optimizers: list,
               record: NonFiniteRecord, device: torch.device, autocast) -> tuple:
    """grad_accum micro-batches, then clip and step unless non-finite; returns (mean loss, grad norm) on device.

    `autocast` is the run's precision (training/precision.py): under bf16 the forward's matmuls run in
    bf16 while the loss module computes its cross-entropy in fp32; the backward runs outside it, in the
    dtypes the forward chose, and the gradients land on the fp32 master weights."""
    total = torch.zeros((), device=device)
    for micro in range(accum):
        x, y = (t.to(device, non_blocking=True) for t in batches.get(step, micro))
        # DDP all-reduces gradients only on the last micro-step instead of `accum` times.
        skip_sync = hasattr(loss_module, "no_sync") and micro < accum - 1
        with loss_module.no_sync() if skip_sync else contextlib.nullcontext():
            with autocast():
                loss = loss_module(x, y) / accum  # fp32 cross-entropy, mean over this micro-batch
            loss.backward()
        total += loss.detach()
    params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
    grad_norm = global_grad_norm(params)
    finite = torch.isfinite(total) & torch.isfinite(grad_norm)
    if grad_clip > 0:
        torch.nn.utils.clip_grads_with_norm_(params, grad_clip, grad_norm)
    commit(optimizers, finite)
    record.update(finite, step + 1)
    return total, grad_norm


def global_grad_norm(params: list) -> torch.Tensor:
    """The L2 norm of all gradients. Under FSDP2 each rank holds shards (DTensors): the norm of
    the full gradient needs their reduction, not the local shard's norm."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor (FSDP2)


def commit(optimizers: list, finite: torch.Tensor) -> None:
    """optimizer.step() only if `finite`, then zero the gradients either way."""
    if all(supports_device_skip(opt) for opt in optimizers):
        found_inf = (~finite).float()
        for opt in optimizers:
            opt.found_inf = found_inf  # the fused kernel skips the whole update when it is 1
            opt.step()
    elif bool(finite):  # note: a CPU-GPU sync point on CUDA (free on a CPU)
        for opt in optimizers:
            opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)


def supports_device_skip(optimizer: torch.optim.Optimizer) -> bool:
    return isinstance(optimizer, torch.optim.Adam) and bool(optimizer.defaults.get("fused"))
