"""The learning-rate schedules: linear warmup, then cosine or warmup–stable–decay (WSD), down to min_lr."""
import math

import torch

from training.config import OptimConfig


def muon_peak_lr(cfg: OptimConfig) -> float:
    return cfg.muon_lr if cfg.muon_lr is not None else cfg.lr


def apply_schedule(optimizers: list, step: int, cfg: OptimConfig, max_steps: int) -> float:
    """Set every param group's learning rate for `step`; returns the (AdamW) lr to log.
    Muon follows the same curve scaled by muon_lr / lr (1 unless optim.muon_lr is set), and each
    group by its own `lr_scale` (μP's per-parameter rule, training/optim/lr_scale.py; 1 under sp, and
    absent from optimizer states saved before it existed)."""
    lr = lr_at(step, cfg, max_steps)
    for optimizer in optimizers:
        scale = muon_peak_lr(cfg) / cfg.lr if isinstance(optimizer, torch.optim.Muon) else 1.0
        for group in optimizer.param_groups:
            group["lr"] = lr * scale * group.get("lr_scale", 1.0)
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
