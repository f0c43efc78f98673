"""Normalisation layers: RMSNorm (LLaMA's) and LayerNorm (the ablation baseline), by name."""
import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x², last dim) + eps) * weight — no mean subtraction, unlike LayerNorm."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        # Ones: at init the layer only rescales each token to unit RMS and adds nothing learned.
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        # Upcast: squaring and averaging in bf16/fp16 loses precision (and fp16 can overflow).
        x = x.float()
        # Mean over the LAST dim only: each token is normalised by its own hidden vector.
        # keepdim=True so the (B, T, 1) statistic broadcasts against (B, T, D).
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        # Cast back before the weight, as HF LlamaRMSNorm does, so later layers see the input dtype.
        return self.weight * x.to(input_dtype)


class LayerNorm(nn.Module):
    """Standard LayerNorm (mean-centred, with bias), same constructor as RMSNorm; fp32 inside too."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Explicit fp32 so both norms see identical precision in an ablation.
        y = nn.functional.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), self.bias.float(), self.eps)
        return y.to(x.dtype)


NORMS = {"rmsnorm": RMSNorm, "layernorm": LayerNorm}
