"""Normalisation layers by name: RMSNorm (LLaMA's), its bf16-computing ablation, LayerNorm, and none."""
import torch
from torch import nn


class RMSNorm(nn.Module):
    """y = x / sqrt(mean(x², last dim) + eps) * weight — no mean subtraction, unlike LayerNorm."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
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

    def init_weights(self, std: float, out_std: float) -> None:
        """std/out_std are unused: ones, so at init the layer only rescales each token to unit RMS."""
        nn.init.ones_(self.weight)


class RMSNormBF16(RMSNorm):
    """RMSNorm with the upcast skipped: squares, mean and rsqrt all in bf16 (model.norm=rmsnorm_bf16).

    The ablation of RMSNorm's upcast: what a pure-bf16 model computes when the norm does not
    upcast. The input is rounded to bf16 whatever its dtype (under CPU fp32 training too), so the
    variant means the same thing on every machine; the output is cast back to the input dtype.
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.bfloat16)
        variance = x.pow(2).mean(dim=-1, keepdim=True)  # bf16: 8 significant bits per square and mean
        x = x * torch.rsqrt(variance + self.eps)
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

    def init_weights(self, std: float, out_std: float) -> None:
        """Weight ones and bias zeros: the identity affine map after standardising."""
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)


class NoNorm(nn.Module):
    """model.norm=none: the identity wherever a norm sits, with no parameters (the table counts 0)."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def init_weights(self, std: float, out_std: float) -> None:
        """Nothing to initialise."""


NORMS = {"rmsnorm": RMSNorm, "rmsnorm_bf16": RMSNormBF16, "layernorm": LayerNorm, "none": NoNorm}
