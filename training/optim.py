"""The optimizers — AdamW, or Muon for the blocks' matrices and AdamW for the rest — with μP's per-group learning
rates, and the schedules that drive them: warmup, then cosine or warmup–stable–decay, re-planned without a jump."""

import math
from typing import Optional, Sequence

import torch
from torch.optim._muon import _adjust_lr  # torch's per-shape lr scaling, reused so it stays in step

from model.transformer import Block, Transformer
from training import distributed as D
from training.config import OptimConfig

# A time budget's end before its first plan (training/budget.py): so far away that past the warmup the lr stays at its
# peak, and nothing trained before the plan depends on an end nobody knew yet.
UNPLANNED_END = 10**9


def hidden_matrices(model: torch.nn.Module) -> list:
    """The blocks' 2-D weights (attention and MLP projections), found by type through any wrapper: what Muon is for
    (not the embedding nor the head). SwiGLU's fused gate_up_proj is orthogonalised as one matrix."""
    seen = {}
    for block in (m for m in model.modules() if isinstance(m, Block)):
        for module in block.modules():
            if isinstance(module, torch.nn.Linear) and module.weight.requires_grad:
                seen.setdefault(id(module.weight), module.weight)
    return list(seen.values())


def scaled_group(params: list, weight_decay: float, lr_scale: float) -> dict:
    """A group at lr_scale × the schedule's lr; its weight decay ÷ lr_scale keeps lr·wd — the fraction each step
    decays — what it is at the base width (as the mup package's MuAdamW), else decay would fade as the model widens."""
    return {"params": params, "weight_decay": weight_decay / lr_scale, "lr_scale": lr_scale}


def param_groups(
    model: torch.nn.Module,
    weight_decay: float,
    exclude: frozenset = frozenset(),
    hidden_lr_scale: Optional[float] = None,
) -> list:
    """Decay only Linear weights (a norm gain or a rare embedding row is not to shrink); `exclude`: another optimizer's
    ids; μP's `hidden_lr_scale` gives the blocks' matrices a group. No empty group: DCP refuses them."""
    hidden_ids = {id(p) for p in hidden_matrices(model)} if hidden_lr_scale is not None else set()
    decay, hidden, no_decay, seen = [], [], [], set(exclude)
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))  # a tied head is the embedding: counted once, as an embedding
                is_matrix = isinstance(module, torch.nn.Linear) and name == "weight"
                (hidden if id(p) in hidden_ids else decay if is_matrix else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0},
        {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0},
    ]
    if hidden:
        groups.insert(0, scaled_group(hidden, weight_decay, hidden_lr_scale))
    return [group for group in groups if group["params"]]


def _mup_multiplier(model: torch.nn.Module) -> Optional[float]:
    """μP's width multiplier m of the Transformer inside `model`, or None under sp (or without one)."""
    cfg = next((m.cfg for m in model.modules() if isinstance(m, Transformer)), None)
    return cfg.width_multiplier if cfg is not None and cfg.parametrization == "mup" else None


def build_adamw(groups: list, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    # fused: the whole update in one pass, on CPU and CUDA alike since torch 2.4
    impl = cfg.impl if cfg.impl != "auto" else "fused" if device_type in ("cpu", "cuda") else "foreach"
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kwargs)


def build_optimizers(
    model: torch.nn.Module, cfg: OptimConfig, device_type: str, bf16_fast: Optional[bool] = None
) -> list:
    """[AdamW], or [Muon, AdamW] for optim.name=muon; muon_ns_dtype=auto orthogonalises in bf16 where bf16 matmuls run
    in hardware (`bf16_fast`, by default what the device reports), else in fp32."""
    m = _mup_multiplier(model)
    if cfg.name == "adamw":
        # μP: the blocks' matrices at lr × m^-exponent (Adam's update is ~lr per entry and aligned with its input, so
        # ΔW·x grows ∝ n: Table 3's 1/fan_in).
        scale = m**-cfg.mup_hidden_lr_exponent if m is not None else None
        return [build_adamw(param_groups(model, cfg.weight_decay, hidden_lr_scale=scale), cfg, device_type)]
    matrices = hidden_matrices(model)
    if not matrices:
        raise ValueError("optim.name=muon found no matrices inside transformer blocks; use optim=adamw")
    if bf16_fast is None:
        bf16_fast = D.bf16_fast(torch.device(device_type))[0]
    ns = cfg.muon_ns_dtype if cfg.muon_ns_dtype != "auto" else "bf16" if bf16_fast else "fp32"
    # match_rms_adamw scales each matrix's lr by 0.2·sqrt(max(rows, cols)): the update has AdamW's RMS (Moonshot,
    # "Muon is Scalable"), so one lr, weight decay and schedule serve both. μP: × 1/sqrt(m), not Adam's 1/m —
    # Muon's update has spectral norm ~1 and no alignment factor, and match_rms_adamw already grows as sqrt(m).
    muon = Muon(
        [scaled_group(matrices, cfg.weight_decay, 1.0 / math.sqrt(m) if m else 1.0)],
        ns_dtype=torch.bfloat16 if ns == "bf16" else torch.float32,
        lr=muon_peak_lr(cfg),
        weight_decay=cfg.weight_decay,
        momentum=cfg.muon_momentum,
        nesterov=True,
        ns_steps=cfg.muon_ns_steps,
        adjust_lr_fn="match_rms_adamw",
    )
    rest = param_groups(model, cfg.weight_decay, exclude=frozenset(id(p) for p in matrices))
    return [muon, build_adamw(rest, cfg, device_type)]


class Muon(torch.optim.Muon):
    """torch.optim.Muon with Newton–Schulz in a chosen dtype (torch's bf16 is 19–21× slower emulated on AVX2,
    BENCHMARKS.md). State and checkpoint format are torch's; with ns_dtype=bfloat16 the step is bitwise torch's."""

    def __init__(self, params, ns_dtype: torch.dtype = torch.bfloat16, **kwargs):
        super().__init__(params, **kwargs)
        self.ns_dtype = ns_dtype  # not in the state dict: a run may resume on another device

    @torch.no_grad()
    def step(self, closure=None):
        """torch.optim._muon._single_tensor_muon, with newton_schulz(..., self.ns_dtype)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params, grads, momentum_buffers = [], [], []
            self._init_group(group, params, grads, momentum_buffers)
            for param, grad, buf in zip(params, grads, momentum_buffers):
                buf.lerp_(grad, 1 - group["momentum"])
                update = grad.lerp(buf, group["momentum"]) if group["nesterov"] else buf
                update = newton_schulz(update, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
                param.mul_(1 - group["lr"] * group["weight_decay"])  # decoupled, with the unscaled lr (as AdamW)
                param.add_(update, alpha=-_adjust_lr(group["lr"], group["adjust_lr_fn"], param.shape))
        return loss


def newton_schulz(grad: torch.Tensor, coefficients: tuple, steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """≈ U Vᵀ of grad = U S Vᵀ: torch's quintic iteration, same coefficients and order; FSDP2's DTensors too."""
    a, b, c = coefficients
    x = grad.to(dtype)
    tall = grad.size(-2) > grad.size(-1)
    if tall:  # the wide orientation: its Gram matrix x xᵀ is the small one
        x = x.mT
    # Out of place: in fp32 `x` may be the momentum buffer itself. Spectral norm <= Frobenius norm <= 1.
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.mT
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.mT if tall else x


def muon_peak_lr(cfg: OptimConfig) -> float:
    return cfg.muon_lr if cfg.muon_lr is not None else cfg.lr


def apply_schedule(optimizers: list, step: int, cfg: OptimConfig, max_steps: int, plans: Sequence[dict] = ()) -> float:
    """Set every group's lr for `step` (× muon_lr / lr for Muon, × its lr_scale); return AdamW's, to log. A time
    budget's `plans` move the end (planned_lr_at), else the schedule runs to max_steps."""
    ends = [(0, UNPLANNED_END)] + [(plan["at_step"], plan["max_steps"]) for plan in plans]
    lr = planned_lr_at(step, cfg, ends) if plans else lr_at(step, cfg, max_steps)
    for optimizer in optimizers:
        scale = muon_peak_lr(cfg) / cfg.lr if isinstance(optimizer, torch.optim.Muon) else 1.0
        for group in optimizer.param_groups:
            group["lr"] = lr * scale * group.get("lr_scale", 1.0)
    return lr


def lr_at(step: float, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup from lr/warmup to lr over warmup_steps, then optim.schedule down to min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "wsd":
        # Constant until the decay starts, so a run resumed with a larger max_steps goes on at the same lr (cosine
        # would jump); then 1-sqrt, which beat linear at equal length (Hägele et al. 2024, §3).
        start = wsd_decay_start(cfg, max_steps)
        if step < start:
            return cfg.lr
        progress = min(1.0, (step - start) / max(1, max_steps - start))
        return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1.0 - math.sqrt(progress))
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def wsd_decay_start(cfg: OptimConfig, max_steps: int) -> int:
    """WSD's first decaying step: decay_fraction of max_steps before the end (never inside warmup)."""
    return max(cfg.warmup_steps, max_steps - max(1, int(cfg.decay_fraction * max_steps + 0.5)))


def planned_lr_at(step: int, cfg: OptimConfig, ends: Sequence[tuple]) -> float:
    """The lr at `step` of a run whose end was planned again and again: ends = [(step planned at, end), …] in order.
    After a plan, what remained of the schedule is laid over the steps that now remain, from where it stood (no jump);
    where nothing yet depended on the end (warmup, WSD's stable phase) the new end is simply taken."""
    anchor, at_virtual, pace, end = 0, 0.0, 1.0, ends[0][1]  # virtual step = at_virtual + (step - anchor) · pace
    for planned_at, new_end in ends[1:]:
        if planned_at > step:
            break
        virtual = at_virtual + (planned_at - anchor) * pace
        end_free = virtual == planned_at and (
            planned_at <= cfg.warmup_steps
            or (cfg.schedule == "wsd" and planned_at < min(wsd_decay_start(cfg, end), wsd_decay_start(cfg, new_end)))
        )
        if end_free:
            anchor, at_virtual, pace, end = planned_at, float(planned_at), 1.0, new_end
        else:
            anchor, at_virtual, pace = planned_at, virtual, (end - virtual) / max(new_end - planned_at, 1)
    return lr_at(at_virtual + (step - anchor) * pace, cfg, end)
