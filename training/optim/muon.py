"""torch.optim.Muon with the Newton–Schulz iteration in a chosen dtype (fp32 where bf16 matmuls are slow),
same-shape matrices orthogonalised stacked in bf16, and a device-side skip of non-finite steps (`found_inf`,
as fused AdamW has).

torch's Muon always orthogonalises in bf16: right on a GPU, but on a CPU without AMX/AVX512-BF16
a bf16 matmul is ~100× slower than fp32 (training/precision.py), which made one Muon step of the
CPU default ~12 s instead of ~0.4 s. Everything else — defaults, validation, parameter groups,
state (`momentum_buffer`) and so the checkpoint format — is torch's; with `ns_dtype=bfloat16`
`step` is bitwise torch's update (tests/test_muon.py), stacked or not.
"""
import torch
from torch.optim._muon import _adjust_lr  # torch's per-shape lr scaling, reused so it stays in step


class Muon(torch.optim.Muon):
    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, stack_mb: float = 32, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype  # not in the state dict: a run may resume on another device
        self.stack_mb = stack_mb  # optim.muon_ns_stack_mb: how much of one shape to orthogonalise at once

    @torch.no_grad()
    def step(self, closure=None):
        """torch.optim._muon._single_tensor_muon, with `newton_schulz(..., self.ns_dtype)` over stacks."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # Set by the training step (training/step.py), as GradScaler sets it for fused Adam: 1 = this
        # step's gradients are not finite, leave weights and momentum as they are — decided on the device.
        skip = getattr(self, "found_inf", None)
        keep = None if skip is None else skip.bool()
        for group in self.param_groups:
            params, grads, momentum_buffers = [], [], []
            self._init_group(group, params, grads, momentum_buffers)
            lr, momentum = group["lr"], group["momentum"]
            for stack in stacks(params, self.stack_mb if self.ns_dtype == torch.bfloat16 else 0):
                new_bufs, updates = [], []
                for i in stack:  # a stack at a time: its updates are the only extra memory held
                    # Out of place when a skip is possible, then selected: the same kernels as in place, so
                    # a committed step is bitwise the in-place one.
                    buf, grad = momentum_buffers[i], grads[i]
                    new_bufs.append(buf.lerp_(grad, 1 - momentum) if skip is None else buf.lerp(grad, 1 - momentum))
                    updates.append(grad.lerp(new_bufs[-1], momentum) if group["nesterov"] else new_bufs[-1])
                updates = newton_schulz(updates[0] if len(stack) == 1 else torch.stack(updates),
                                        group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                for i, new_buf, update in zip(stack, new_bufs, [updates] if len(stack) == 1 else updates.unbind(0)):
                    param = params[i]
                    new = param.mul_(1 - lr * group["weight_decay"]) if skip is None else param.mul(
                        1 - lr * group["weight_decay"])  # decoupled, with the unscaled lr (as AdamW)
                    new.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], param.shape))
                    if keep is not None:
                        _keep_or_take(keep, momentum_buffers[i], new_buf)
                        _keep_or_take(keep, param, new)
        return loss


def stacks(params: list, stack_mb: float) -> list:
    """The parameters' indices in groups orthogonalised together: same shape, up to stack_mb of bf16 each.

    Stacking is a speed-up for the small matrices of small models (a model 192 wide has 24 of 192 × 192 to
    192 × 1024: one batched matmul instead of 16 for each shape; BENCHMARKS.md): in bf16 oneDNN's batched
    matmul is its per-matrix one, so the result is bitwise the same. Not in fp32 (MKL's batched GEMM sums
    some shapes in another order, and stacking won nothing measurable there), nor for FSDP2's sharded
    DTensors, which stay one at a time. The cap bounds the extra memory a large model's step holds.
    """
    out, open_ = [], {}
    for i, p in enumerate(params):
        if stack_mb <= 0 or hasattr(p, "to_local"):
            out.append([i])
            continue
        stack = open_.get(p.shape)
        if stack is None or 2 * p.numel() * (len(stack) + 1) > stack_mb * 2**20:
            stack = open_[p.shape] = []
            out.append(stack)
        stack.append(i)
    return out


def _keep_or_take(keep: torch.Tensor, old: torch.Tensor, new: torch.Tensor) -> None:
    """old ← new unless `keep` (a 0-d bool on the device), in place. Under FSDP2 both are sharded
    DTensors: select on the local shards, which share their storage."""
    local = lambda t: t.to_local() if hasattr(t, "to_local") else t  # noqa: E731
    local(old).copy_(torch.where(keep, local(old), local(new)))


def newton_schulz(grad: torch.Tensor, coefficients: tuple, steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """≈ U Vᵀ of grad = U S Vᵀ: torch's quintic iteration (same coefficients, same order of operations), of
    one matrix or of a stack of them (batch, rows, cols), each normalised by its own norm.

    Works on FSDP2's sharded DTensors too: each matmul redistributes as needed, so the result is
    the orthogonalisation of the whole matrix (tests/test_muon.py runs it under torchrun).
    """
    a, b, c = coefficients
    x = grad.to(dtype)
    tall = grad.size(-2) > grad.size(-1)
    if tall:  # iterate on the wide orientation: the Gram matrix x xᵀ is then the small one
        x = x.mT
    # Out of place: in fp32 `x` may be the momentum buffer itself. Spectral norm <= Frobenius norm
    # <= 1 puts every singular value inside the iteration's basin.
    x = x / (x.norm() if x.dim() == 2 else x.norm(dim=(-2, -1), keepdim=True)).clamp(min=eps)
    add_product = torch.addmm if x.dim() == 2 else torch.baddbmm
    for _ in range(steps):
        gram = x @ x.mT
        x = add_product(x, add_product(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x
