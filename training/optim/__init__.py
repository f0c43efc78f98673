"""The optimizers — AdamW, or Muon for the blocks' matrices with AdamW for the rest — and the
learning-rate schedule that drives them (schedule.py)."""
import torch

from training.config import OptimConfig
from training.optim.adamw import build_adamw, hidden_matrices, param_groups
from training.optim.lr_scale import adamw_hidden_lr_scale, model_config, muon_hidden_lr_scale, scaled_group
from training.optim.muon import Muon
from training.optim.schedule import apply_schedule, lr_at, muon_peak_lr, wsd_decay_start
from training.runtime.cpu import cpu_class

__all__ = ["Muon", "apply_schedule", "build_adamw", "build_optimizer", "build_optimizers", "hidden_matrices",
           "lr_at", "param_groups", "wsd_decay_start"]


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    """AdamW over every parameter (optim.name=adamw); under μP the blocks' matrices at lr × 1/m."""
    hidden_lr_scale = adamw_hidden_lr_scale(model_config(model), cfg.mup_hidden_lr_exponent)
    return build_adamw(param_groups(model, cfg.weight_decay, hidden_lr_scale=hidden_lr_scale), cfg, device_type)


def build_optimizers(model: torch.nn.Module, cfg: OptimConfig, device_type: str) -> list:
    """Every optimizer the run steps: [AdamW], or [Muon, AdamW] for optim.name=muon.
    Checkpointing passes the whole list to torch.distributed.checkpoint's state-dict API."""
    if cfg.name == "adamw":
        return [build_optimizer(model, cfg, device_type)]
    matrices = hidden_matrices(model)
    if not matrices:
        raise ValueError("optim.name=muon found no matrices inside transformer blocks; use optim=adamw")
    ns_dtype = newton_schulz_dtype(cfg.muon_ns_dtype, device_type)
    # match_rms_adamw scales each matrix's lr by 0.2·sqrt(max(rows, cols)), so the update has the
    # RMS AdamW's would (Moonshot, "Muon is Scalable for LLM Training"): one optim.lr and one
    # optim.weight_decay mean the same for both optimizers, and the one schedule drives both.
    # μP: × 1/sqrt(m), not Adam's 1/m — match_rms_adamw already grows with width (lr_scale.py).
    scale = muon_hidden_lr_scale(model_config(model)) or 1.0
    muon = Muon([scaled_group(matrices, cfg.weight_decay, scale)],
                ns_dtype=ns_dtype, stack_mb=cfg.muon_ns_stack_mb,
                lr=muon_peak_lr(cfg), weight_decay=cfg.weight_decay, momentum=cfg.muon_momentum, nesterov=True,
                ns_steps=cfg.muon_ns_steps, adjust_lr_fn="match_rms_adamw")
    rest = param_groups(model, cfg.weight_decay, exclude=frozenset(id(p) for p in matrices))
    return [muon, build_adamw(rest, cfg, device_type)]


def newton_schulz_dtype(requested: str, device_type: str) -> torch.dtype:
    """Muon's Newton–Schulz dtype: optim.muon_ns_dtype, where "auto" is bf16 wherever bf16 matmuls are fast —
    GPUs (torch's own choice) and CPUs with bf16 in hardware (AMX, AVX512-BF16: 1.7x faster at the default's
    shapes, the same orthogonalisation to bf16's precision; BENCHMARKS.md) — and fp32 where oneDNN would
    emulate bf16 (AVX2-only CPUs, ~100x slower)."""
    if requested == "auto":
        fast = device_type == "cuda" or (device_type == "cpu" and cpu_class().bf16_in_hardware)
        requested = "bf16" if fast else "fp32"
    return torch.bfloat16 if requested == "bf16" else torch.float32
