"""The learning-rate schedules: linear warmup, then cosine or warmup–stable–decay (WSD), down to min_lr."""
import math
from typing import Sequence

import torch

from training.config import OptimConfig


def muon_peak_lr(cfg: OptimConfig) -> float:
    return cfg.muon_lr if cfg.muon_lr is not None else cfg.lr


def apply_schedule(optimizers: list, step: int, cfg: OptimConfig, max_steps: int, ends: Sequence[tuple] = ()) -> float:
    """Set every param group's learning rate for `step`; returns the (AdamW) lr to log. `ends`: a time
    budget's plans, (step, end) each (planned_lr_at), else the schedule runs to max_steps.
    Muon follows the same curve scaled by muon_lr / lr (1 unless optim.muon_lr is set), and each
    group by its own `lr_scale` (μP's per-parameter rule, training/optim/lr_scale.py; 1 under sp, and
    absent from optimizer states saved before it existed)."""
    lr = planned_lr_at(step, cfg, ends) if len(ends) > 1 else lr_at(step, cfg, ends[0][1] if ends else max_steps)
    for optimizer in optimizers:
        scale = muon_peak_lr(cfg) / cfg.lr if isinstance(optimizer, torch.optim.Muon) else 1.0
        for group in optimizer.param_groups:
            group["lr"] = lr * scale * group.get("lr_scale", 1.0)
    return lr


def planned_lr_at(step: int, cfg: OptimConfig, ends: Sequence[tuple]) -> float:
    """The learning rate at `step` of a run whose end was planned again and again: ends = [(step planned at,
    the end planned), …] in order (training/budget.py).

    A new end must not make the learning rate jump, as cosine's curve would if simply stretched. So after a
    plan the schedule runs on a stretched clock: the part of the schedule that remained is laid over the
    steps that now remain, starting from where the schedule stood — the same learning rate, then a new pace.
    Where nothing yet depended on the end (inside the warmup; WSD's stable phase, under the old end and the
    new), the new end is simply taken: the curve is then exactly the one of a run told that end outright.
    """
    anchor, at_virtual, pace, end = 0, 0.0, 1.0, ends[0][1]  # virtual step = at_virtual + (step - anchor) · pace
    for planned_at, new_end in ends[1:]:
        if planned_at > step:
            break
        virtual = at_virtual + (planned_at - anchor) * pace
        if _end_free(planned_at, virtual, cfg, end, new_end):
            anchor, at_virtual, pace, end = planned_at, float(planned_at), 1.0, new_end
        else:
            anchor, at_virtual, pace = planned_at, virtual, (end - virtual) / max(new_end - planned_at, 1)
    return lr_at(at_virtual + (step - anchor) * pace, cfg, end)


def _end_free(step: int, virtual: float, cfg: OptimConfig, end: int, new_end: int) -> bool:
    """Whether the learning rate up to `step` is the same under the old end and the new one."""
    if virtual != step:  # already stretched: the curve so far depended on an end
        return False
    if step <= cfg.warmup_steps:
        return True
    return cfg.schedule == "wsd" and step < min(wsd_decay_start(cfg, end), wsd_decay_start(cfg, new_end))


def lr_at(step: float, cfg: OptimConfig, max_steps: int) -> float:
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
