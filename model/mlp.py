"""Feed-forward blocks: SwiGLU (LLaMA's) and GeGLU, GELU and ReLU² baselines, plus the width rule.

Every MLP owns `init_weights(std, out_std)`: `out_std` goes to the layer whose output is added to
the residual stream (tests/test_transformer.py finds those layers by tracing, not by name).
"""
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from model.rounding import find_multiple


def swiglu_intermediate_size(hidden_size: int, multiple_of: int, ffn_dim_multiplier: Optional[float] = None) -> int:
    """Meta's LLaMA rule: int(2·4d/3), optionally × ffn_dim_multiplier, rounded UP to multiple_of.

    Why 8/3: a classic MLP d→4d→d has two matrices, 8·d² weights. A gated MLP has three
    (gate, up, down); with width I that is 3·d·I, and 3·d·I = 8·d² gives I = 8d/3.
    Why round UP to multiple_of: matmuls whose sizes are multiples of 32/64/256 map onto hardware
    tiles; rounding up (never down) keeps at least the intended capacity. (4096, 256) → 11008.
    """
    hidden = int(2 * (4 * hidden_size) / 3)
    if ffn_dim_multiplier is not None:
        hidden = int(ffn_dim_multiplier * hidden)
    return find_multiple(hidden, multiple_of)


class SwiGLU(nn.Module):
    """down_proj(silu(gate) * up), with gate and up computed by ONE fused Linear."""

    activation = staticmethod(F.silu)
    gated = True  # three projections: its width follows the 8/3·d rule (ModelConfig reads this)

    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float = 0.0):
        super().__init__()
        # Fused: gate and up read the same input and have the same width, so one d→2I matmul
        # does the work of two (one kernel launch, better utilisation).
        self.gate_up_proj = nn.Linear(hidden_size, 2 * intermediate_size, bias=False)
        # Back to d: the residual stream needs the input's width.
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Both halves are used: gate (first half) decides how much of up (second half) passes.
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # each (B, T, I)
        return self.dropout(self.down_proj(self.activation(gate) * up))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.gate_up_proj.weight, mean=0.0, std=std)
        nn.init.normal_(self.down_proj.weight, mean=0.0, std=out_std)  # writes into the residual stream


class GeGLU(SwiGLU):
    """Same gated structure with GELU as the gate (Shazeer 2020)."""

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
