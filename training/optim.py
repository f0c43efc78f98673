"""AdamW with decay/no-decay parameter groups, and the warmup + cosine learning-rate schedule."""
import math

import torch

from training.config import OptimConfig


def param_groups(model: torch.nn.Module, weight_decay: float) -> list:
    """Decay only matrices of Linear layers. Norm gains, biases and embeddings get no decay:
    shrinking a norm gain toward 0 or an embedding row that is rarely seen is not regularisation."""
    decay, no_decay, seen = [], [], set()
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))  # a tied head is the embedding: count it once, as an embedding
            is_matrix = isinstance(module, torch.nn.Linear) and name == "weight"
            (decay if is_matrix else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    if cfg.impl not in ("auto", "fused", "foreach", "plain"):
        raise ValueError(f"optim.impl={cfg.impl!r} is unknown; choose auto, fused, foreach or plain")
    impl = cfg.impl
    if impl == "auto":
        # The fused kernel does the whole update in one pass; CPU and CUDA both have it in torch ≥ 2.4.
        impl = "fused" if device_type in ("cpu", "cuda") else "foreach"
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             eps=cfg.eps, **kwargs)


def build_optimizers(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> list:
    """Every optimizer the run steps, as a list (one today; a split such as Muon + AdamW gives two).
    Checkpointing passes the whole list to torch.distributed.checkpoint's state-dict API."""
    return [build_optimizer(model, cfg, device_type)]


def apply_schedule(optimizers: list, step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Set every param group's learning rate for `step`; returns the lr to log."""
    lr = lr_at(step, cfg, max_steps)
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            group["lr"] = lr
    return lr


def lr_at(step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Linear warmup from lr/warmup to lr, then cosine decay to min_lr at max_steps."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, max_steps - cfg.warmup_steps))
    return cfg.min_lr + 0.5 * (1.0 + math.cos(math.pi * progress)) * (cfg.lr - cfg.min_lr)
