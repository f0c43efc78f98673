"""Per-parameter learning-rate multipliers: each param group carries an `lr_scale` that apply_schedule
multiplies into the scheduled lr, so the one schedule drives every group. Today's only source is μP's
hidden-matrix rule (docs/mup.md); under sp every scale is 1.0 and the groups are what they always were.
"""
import math
from typing import Optional

import torch

from model import ModelConfig, Transformer
from model.parametrization import width_multiplier


def model_config(model: torch.nn.Module) -> Optional[ModelConfig]:
    """The config of the Transformer inside `model` (bare, or wrapped by the loss, DDP or FSDP2); None
    for a model without one (its parameters then get sp's plain groups)."""
    return next((module.cfg for module in model.modules() if isinstance(module, Transformer)), None)


def _is_mup(cfg: Optional[ModelConfig]) -> bool:
    return cfg is not None and cfg.parametrization == "mup"


def adamw_hidden_lr_scale(cfg: Optional[ModelConfig], exponent: float = 1.0) -> Optional[float]:
    """AdamW's lr × 1/m for the blocks' matrices under mup (Table 3: Adam LR 1/fan_in); None under sp.

    Adam's update has entries of size ~lr whatever the width, and it is aligned with the activations
    it next multiplies: ΔW·x sums n coherent terms, ~lr·n. Keeping that Θ(1) takes lr ∝ 1/n. `exponent`
    (optim.mup_hidden_lr_exponent) makes it m^-exponent: an arm of docs/mup.md's AdamW experiment."""
    return width_multiplier(cfg) ** -exponent if _is_mup(cfg) else None


def muon_hidden_lr_scale(cfg: Optional[ModelConfig]) -> Optional[float]:
    """Muon's lr × 1/sqrt(m) under mup (with adjust_lr_fn="match_rms_adamw"); None under sp.

    Muon's update is orthogonalised: every singular value ≈ 1, spectral norm 1, so ΔW·x has norm
    ≈ adjust·lr·|x| — no extra factor n from alignment as Adam's sign-like update has. μP asks for a
    spectral norm Θ(sqrt(fan_out/fan_in)) = Θ(1) for the blocks' matrices (Yang, Simon & Bernstein
    2023). match_rms_adamw's adjust is 0.2·sqrt(max(fan_out, fan_in)) ∝ sqrt(m): 1/sqrt(m) cancels it.
    1/m (Adam's rule) would scale twice: the updates would shrink as 1/sqrt(m) (docs/mup.md measures it)."""
    return 1.0 / math.sqrt(width_multiplier(cfg)) if _is_mup(cfg) else None


def scaled_group(params: list, weight_decay: float, lr_scale: float) -> dict:
    """A param group whose lr is lr_scale × the schedule's. Its weight_decay is divided by lr_scale so
    that lr·weight_decay, the fraction each step decays, stays what it is at the base width (as the
    mup package's MuAdamW does): otherwise decay would fade away as the model widens."""
    return {"params": params, "weight_decay": weight_decay / lr_scale, "lr_scale": lr_scale}
