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
        x = x.float()  # upcast: squaring and averaging in bf16/fp16 loses precision (and fp16 can overflow)
        # Mean over the LAST dim only, keepdim so the (B, T, 1) statistic broadcasts against (B, T, D).
        variance = x.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(input_dtype)  # cast back before the weight, as HF's LlamaRMSNorm

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.ones_(self.weight)  # at init the layer only rescales each token to unit RMS


class RMSNormBF16(RMSNorm):
    """model.norm=rmsnorm_bf16, the ablation of the upcast: squares, mean and rsqrt in bf16 whatever the input dtype
    (so the variant means the same on every machine); the output is cast back to the input dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        x = x.to(torch.bfloat16)
        variance = x.pow(2).mean(dim=-1, keepdim=True)  # bf16: 8 significant bits per square and mean
        x = x * torch.rsqrt(variance + self.eps)
        return self.weight * x.to(input_dtype)


class LayerNorm(nn.Module):
    """Standard LayerNorm (mean-centred, with bias), RMSNorm's constructor; fp32 inside too, for a fair ablation."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = nn.functional.layer_norm(x.float(), (x.shape[-1],), self.weight.float(), self.bias.float(), self.eps)
        return y.to(x.dtype)

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)


class NoNorm(nn.Module):
    """model.norm=none: the identity wherever a norm sits, with no parameters."""

    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def init_weights(self, std: float, out_std: float) -> None:
        pass


NORMS = {"rmsnorm": RMSNorm, "rmsnorm_bf16": RMSNormBF16, "layernorm": LayerNorm, "none": NoNorm}
