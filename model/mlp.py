"""Feed-forward blocks by name: SwiGLU (LLaMA's), GeGLU, GELU and ReLU² — and the width rule. Each owns
init_weights(std, out_std); out_std goes to the layer that writes into the residual stream."""

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


def swiglu_intermediate_size(hidden_size: int, multiple_of: int, ffn_dim_multiplier: Optional[float] = None) -> int:
    """Meta's LLaMA rule: int(2·4d/3), optionally × ffn_dim_multiplier, rounded UP to multiple_of: (4096, 256) → 11008.

    8/3 because a gated MLP has three matrices: 3·d·I = 8·d² (a classic d→4d→d MLP's two) gives I = 8d/3. Round up,
    never down, so a hardware-friendly size keeps at least the intended capacity."""
    hidden = int(2 * (4 * hidden_size) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return hidden if hidden % multiple_of == 0 else hidden + multiple_of - hidden % multiple_of


class SwiGLU(nn.Module):
    """down_proj(silu(gate) * up), with gate and up computed by ONE fused Linear."""

    activation = staticmethod(F.silu)
    gated = True  # three projections: its width follows the 8/3·d rule

    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float = 0.0):
        super().__init__()
        # Fused: gate and up read the same input with the same width, so one d→2I matmul does the work of two.
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)  # back to the residual stream's width
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # each (B, T, I): gate decides how much of up passes
        return self.dropout(self.down_proj(self.activation(gate) * up))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.gate_up_proj.weight, mean=0.0, std=std)
        nn.init.normal_(self.down_proj.weight, mean=0.0, std=out_std)  # writes into the residual stream


class GeGLU(SwiGLU):
    """The same gated structure with GELU as the gate (Shazeer 2020)."""

    activation = staticmethod(F.gelu)


class GeluMLP(nn.Module):
    """The conventional transformer MLP: d → I (4·d by default) → d with GELU."""

    gated = False  # two projections: width 4·d

    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float = 0.0):
        super().__init__()
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.dropout = nn.Dropout(dropout)

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        return F.gelu(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.down_proj(self.activation(self.up_proj(x))))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.up_proj.weight, mean=0.0, std=std)
        nn.init.normal_(self.down_proj.weight, mean=0.0, std=out_std)  # writes into the residual stream


class ReLU2MLP(GeluMLP):
    """Squared ReLU (Primer, So et al. 2021): cheap and competitive with gated MLPs."""

    def activation(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).square()


MLPS = {"swiglu": SwiGLU, "geglu": GeGLU, "gelu": GeluMLP, "relu2": ReLU2MLP}
