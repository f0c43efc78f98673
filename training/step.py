"""One optimizer step under the run's precision, and the non-finite policy: a step whose loss or gradient
norm is not finite never reaches the weights, and the run stops by `trainer.skip_nonfinite_steps`.

The check runs on the device. On a GPU, fused AdamW and minillama's Muon take the flag into their update
(`found_inf`, the mechanism GradScaler uses) and leave weights, moments and step counts untouched — no
host sync per step; any other optimizer gets a host check there (a sync). On a CPU the host reads the flag
(free: the tensor is host memory) and a good step updates in place, which is cheaper than Muon's out-of-place
update and select. The loop reads the record when it logs, evaluates or saves: never past an unchecked step.
"""
import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from training.optim.muon import Muon


class NonFiniteLoss(ValueError):
    """Training hit non-finite losses or gradients (the updates were skipped; nothing non-finite was saved)."""


@dataclass
class StepResult:
    loss: torch.Tensor  # the mean loss over the micro-batches, on the device
    grad_norm: torch.Tensor  # before clipping, on the device


class TrainStep:
    """`step(n)`: the grad_accum micro-batches of optimizer step n (0-based), clip, commit unless non-finite."""

    def __init__(self, loss_module, batches, optimizers: list, autocast, accum: int, grad_clip: float,
                 device: torch.device, tolerated: int = 0):
        self.loss_module, self.batches, self.optimizers = loss_module, batches, optimizers
        self.autocast, self.accum, self.grad_clip, self.device = autocast, accum, grad_clip, device
        self.params = [p for opt in optimizers for group in opt.param_groups for p in group["params"]]
        self.guard = NonFiniteGuard(device, tolerated)
        self.skip_on_device = device.type != "cpu"  # commit(): a host read of the flag is a sync only off a CPU

    @classmethod
    def for_run(cls, ctx) -> "TrainStep":
        """A run's step, from its RunContext (training/context.py): the built loss, optimizers and autocast, the
        batches, and the trainer's accumulation and non-finite tolerance and optim.grad_clip."""
        trainer = ctx.cfg.trainer
        return cls(ctx.parts.compute_loss, ctx.batches, ctx.parts.optimizers, ctx.parts.autocast,
                   trainer.grad_accum_steps, ctx.cfg.optim.grad_clip, ctx.info.device, trainer.skip_nonfinite_steps)

    def __call__(self, step: int) -> StepResult:
        total = torch.zeros((), device=self.device)
        for micro in range(self.accum):
            x, y = (t.to(self.device, non_blocking=True) for t in self.batches.get(step, micro))
            # DDP all-reduces gradients only on the last micro-step instead of `accum` times.
            skip_sync = hasattr(self.loss_module, "no_sync") and micro < self.accum - 1
            with self.loss_module.no_sync() if skip_sync else contextlib.nullcontext():
                # The forward under the run's autocast (bf16 matmuls; the loss module's cross-entropy
                # upcasts to fp32); backward outside it, in the dtypes the forward chose, the gradients
                # landing on the fp32 master weights.
                with self.autocast():
                    loss = self.loss_module(x, y) / self.accum  # mean over this micro-batch
                loss.backward()
            total += loss.detach()
        grad_norm = global_grad_norm(self.params)
        finite = torch.isfinite(total) & torch.isfinite(grad_norm)
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(self.params, self.grad_clip, grad_norm)
        commit(self.optimizers, finite, self.skip_on_device)
        self.guard.update(finite, step + 1)
        return StepResult(total, grad_norm)


def global_grad_norm(params: list) -> torch.Tensor:
    """The L2 norm of all gradients. Under FSDP2 each rank holds shards (DTensors): the norm of
    the full gradient needs their reduction, not the local shard's norm."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor (FSDP2)


def commit(optimizers: list, finite: torch.Tensor, on_device: bool) -> None:
    """optimizer.step() only if `finite`, then zero the gradients either way. `on_device`: optimizers that can
    read the decision from the device (supports_device_skip) are handed it as `found_inf` instead of the host
    reading `finite`, a CPU-GPU sync on CUDA. On a CPU the read is free and the plain in-place update is
    faster than Muon's skippable one (out of place, then selected): 2–4 ms of the default step on AMX
    (BENCHMARKS.md, "A non-finite check without a select on a CPU")."""
    if on_device and all(supports_device_skip(opt) for opt in optimizers):
        found_inf = (~finite).float()
        for opt in optimizers:
            opt.found_inf = found_inf  # the update kernels skip the whole update when it is 1
            opt.step()
    elif bool(finite):  # note: a CPU-GPU sync point on CUDA (free on a CPU)
        for opt in optimizers:
            opt.step()
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)


def supports_device_skip(optimizer: torch.optim.Optimizer) -> bool:
    """Whether `optimizer.step()` honours a device-side `found_inf` flag."""
    fused_adam = isinstance(optimizer, torch.optim.Adam) and bool(optimizer.defaults.get("fused"))
    return fused_adam or isinstance(optimizer, Muon)


class NonFiniteGuard:
    """Device-side counters of skipped steps, and the policy that reads them: stop at the first
    non-finite step (tolerated=0), or at the `tolerated`-th in a row (OLMo's spike guard)."""

    def __init__(self, device: torch.device, tolerated: int = 0):
        zero = lambda v=0: torch.tensor(v, device=device, dtype=torch.int64)  # noqa: E731
        self.tolerated = tolerated
        self.skipped, self.streak, self.max_streak, self.first_bad = zero(), zero(), zero(), zero(-1)

    def update(self, finite: torch.Tensor, step: int) -> None:
        """Count optimizer step `step` (1-based) as skipped unless `finite` — on the device."""
        bad = (~finite).long()
        self.skipped += bad
        self.streak.add_(1).mul_(bad)  # +1 on a bad step, back to 0 on a good one
        torch.maximum(self.max_streak, self.streak, out=self.max_streak)
        self.first_bad.copy_(torch.where((self.first_bad < 0) & (bad > 0), step, self.first_bad))

    def read(self) -> dict:
        """Host values since the last read (note: a CPU-GPU sync point — once per log/eval/save step)."""
        values = torch.stack([self.skipped, self.streak, self.max_streak, self.first_bad]).tolist()
        self.skipped.zero_()
        self.max_streak.copy_(self.streak)
        self.first_bad.fill_(-1)
        return dict(zip(("skipped", "streak", "max_streak", "first_bad"), values))

    def check(self, step: int, last_good: Optional[Path]) -> dict:
        """The record since the last check; NonFiniteLoss when the policy says stop."""
        record = self.read()
        if not record["skipped"] and record["max_streak"] < max(self.tolerated, 1):
            return record
        where = f"the last good checkpoint is {last_good}" if last_good else "no checkpoint was written yet"
        advice = "lower optim.lr, raise optim.warmup_steps or check the data"
        if self.tolerated == 0:
            raise NonFiniteLoss(f"non-finite loss or gradient at step {record['first_bad']} (update skipped, weights "
                                f"unchanged); {where} — {advice}, or set trainer.skip_nonfinite_steps=N to skip such "
                                "steps")
        if record["max_streak"] >= self.tolerated:
            raise NonFiniteLoss(f"{record['max_streak']} non-finite steps in a row (trainer.skip_nonfinite_steps="
                                f"{self.tolerated}) by step {step}; {where} — {advice}")
        return record
