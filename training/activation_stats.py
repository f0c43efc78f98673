"""Per-layer RMS of the residual stream (and of the normed block inputs), via forward hooks.

This is what RMSNorm exists to keep stable; hooks are attached only for the one eval batch that
measures it, so training steps pay nothing.
"""
from typing import Callable, Dict, List, Optional

import torch


def _rms(t: torch.Tensor) -> float:
    return t.detach().float().pow(2).mean().sqrt().item()


@torch.no_grad()
def activation_rms(model: torch.nn.Module, input_ids: torch.Tensor,
                   forward: Optional[Callable[[], object]] = None) -> Dict[str, List[float]]:
    """{'residual': [after block 0, 1, …], 'attn_in': [...], 'mlp_in': [...]} for one batch.

    `forward` runs the batch through whatever wraps `model` (under FSDP2 the root module must run,
    so that it gathers the embedding and head); by default `model(input_ids)`.
    """
    stats: Dict[str, List[float]] = {"residual": [], "attn_in": [], "mlp_in": []}
    hooks = []
    for block in model.layers:
        hooks.append(block.register_forward_hook(lambda m, i, out: stats["residual"].append(_rms(out))))
        hooks.append(block.attn_norm.register_forward_hook(lambda m, i, out: stats["attn_in"].append(_rms(out))))
        hooks.append(block.mlp_norm.register_forward_hook(lambda m, i, out: stats["mlp_in"].append(_rms(out))))
    try:
        forward() if forward is not None else model(input_ids)
    finally:
        for h in hooks:
            h.remove()
    return stats
