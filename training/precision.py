"""Mixed precision: bf16 autocast over fp32 master weights, or plain fp32."""
import contextlib

import torch


def autocast_context(precision: str, device: torch.device):
    """A zero-argument factory of autocast contexts for this precision and device.

    bf16 autocast runs matmuls in bf16 (≈2× faster on 2 CPU threads here, far more on tensor
    cores) while parameters, gradients and optimizer state stay fp32, so small updates are not
    rounded away. bf16 has fp32's exponent range, so unlike fp16 no loss scaling is needed.
    """
    if precision == "fp32":
        return contextlib.nullcontext
    if precision != "bf16":
        raise ValueError(f"trainer.precision={precision!r} is unknown; choose bf16 or fp32")
    if device.type == "mps":
        raise ValueError("trainer.precision=bf16 autocast is not supported on mps here; use trainer.precision=fp32")
    return lambda: torch.autocast(device_type=device.type, dtype=torch.bfloat16)
