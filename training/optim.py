"""The optimizers — AdamW, or Muon for the blocks' matrices with AdamW for the rest — and the
learning-rate schedules: warmup + cosine, or warmup–stable–decay (WSD)."""
import math

import torch

from model.transformer import Block
from training.config import OptimConfig
from training.muon import Muon


def param_groups(model: torch.nn.Module, weight_decay: float, exclude: frozenset = frozenset()) -> list:
    """Decay only matrices of Linear layers. Norm gains, biases and embeddings get no decay:
    shrinking a norm gain toward 0 or an embedding row that is rarely seen is not regularisation.
    Parameters whose id is in `exclude` (those another optimizer owns) are left out, and so is an
    empty group (e.g. no decayed matrix beside Muon's): torch.distributed.checkpoint refuses those
    when it saves several optimizers."""
    decay, no_decay, seen = [], [], set(exclude)
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))  # a tied head is the embedding: count it once, as an embedding
            is_matrix = isinstance(module, torch.nn.Linear) and name == "weight"
            (decay if is_matrix else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [group for group in groups if group["params"]]


def hidden_matrices(model: torch.nn.Module) -> list:
    """The 2-D weights inside the transformer blocks (attention and MLP projections): what Muon is for.

    The embedding is a lookup table and the head maps to a vocabulary — neither is a hidden linear
    map whose update should be orthogonalised (Keller Jordan's Muon, nanochat), and a tied head is
    the embedding. Found by module type, so any wrapper (DDP, FSDP2, the loss module) is fine.
    SwiGLU's fused gate_up_proj is orthogonalised as one (2·intermediate, hidden) matrix, not as
    gate and up apart: torch's Muon takes whole 2-D parameters.
    """
    matrices, seen = [], set()
    for block in model.modules():
        if isinstance(block, Block):
            for module in block.modules():
                weight = getattr(module, "weight", None)
                if isinstance(module, torch.nn.Linear) and weight.requires_grad and id(weight) not in seen:
                    seen.add(id(weight))
                    matrices.append(weight)
    return matrices


def build_adamw(groups: list, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    impl = cfg.impl
    if impl == "auto":
        # The fused kernel does the whole update in one pass; CPU and CUDA both have it in torch ≥ 2.4.
        impl = "fused" if device_type in ("cpu", "cuda") else "foreach"
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kwargs)


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW over every parameter (optim.name=adamw)."""
    return build_adamw(param_groups(model, cfg.weight_decay), cfg, device_type)


def build_optimizers(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> list:
    """Every optimizer the run steps: [AdamW], or [Muon, AdamW] for optim.name=muon.
    Checkpointing passes the whole list to torch.distributed.checkpoint's state-dict API."""
    if cfg.name == "adamw":
        return [build_optimizer(model, cfg, device_type)]
    matrices = hidden_matrices(model)
    if not matrices:
        raise ValueError("optim.name=muon found no matrices inside transformer blocks; use optim=adamw")
    ns_dtype = cfg.muon_ns_dtype
    if ns_dtype == "auto":  # bf16 Newton–Schulz is torch's choice on GPUs, ~100× slow on AVX2-only CPUs
        ns_dtype = "bf16" if device_type == "cuda" else "fp32"
    # match_rms_adamw scales each matrix's lr by 0.2·sqrt(max(rows, cols)), so the update has the
    # RMS AdamW's would (Moonshot, "Muon is Scalable for LLM Training"): one optim.lr and one
    # optim.weight_decay mean the same for both optimizers, and the one schedule drives both.
    muon = Muon(matrices, ns_dtype=torch.bfloat16 if ns_dtype == "bf16" else torch.float32,
                lr=muon_peak_lr(cfg), weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum, nesterov=True,
                ns_steps=cfg.muon_ns_steps, adjust_lr_fn="match_rms_adamw")
    rest = param_groups(model, cfg.weight_decay, exclude=frozenset(id(p) for p in matrices))
    return [muon, build_adamw(rest, cfg, device_type)]


def muon_peak_lr(cfg: OptimConfig) -> float:
    return cfg.muon_lr if cfg.muon_lr is not None else cfg.lr


def apply_schedule(optimizers: list, step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Set every param group's learning rate for `step`; returns the (AdamW) lr to log.
    Muon follows the same curve scaled by muon_lr / lr (1 unless optim.muon_lr is set)."""
    lr = lr_at(step, cfg, max_steps)
    for optimizer in optimizers:
        scale = muon_peak_lr(cfg) / cfg.lr if isinstance(optimizer, torch.optim.Muon) else 1.0
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
    return lr


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup from lr/warmup to lr over warmup_steps, then optim.schedule; min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    if cfg.schedule == "wsd":
        return _wsd(step, cfg, max_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)


def wsd_decay_start(cfg: OptimConfig, max_steps: int) -> int:
    """The first step of WSD's decay: decay_fraction of max_steps before the end (never inside warmup)."""
    decay_steps = max(1, int(cfg.decay_fraction * max_steps + 0.5))
    return max(cfg.warmup_steps, max_steps - decay_steps)


def _wsd(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Constant lr until the decay starts, then 1-sqrt down to min_lr at max_steps.

    The stable phase does not depend on max_steps, so a run resumed with a larger
    trainer.max_steps continues at the same lr (cosine would jump: its curve stretches).
    1-sqrt rather than linear: at equal decay length it reached a lower loss in Hägele et al.
    2024 ("Scaling Laws and Compute-Optimal Training Beyond Fixed Training Durations", §3).
    """
    start = wsd_decay_start(cfg, max_steps)
    if step < start:
        return cfg.lr
    progress = min(1.0, (step - start) / max(1, max_steps - start))
    return cfg.min_lr + (cfg.lr - cfg.min_lr) * (1.0 - math.sqrt(progress))
