"""AdamW's parameter groups (decay for matrices only) and its kernel choice; which matrices Muon owns."""
from typing import Optional

import torch

from model.transformer import Block
from training.config import OptimConfig
from training.optim.lr_scale import scaled_group


def param_groups(model: torch.nn.Module, weight_decay: float, exclude: frozenset = frozenset(),
                 hidden_lr_scale: Optional[float] = None) -> list:
    """Decay only matrices of Linear layers. Norm gains, biases and embeddings get no decay:
    shrinking a norm gain toward 0 or an embedding row that is rarely seen is not regularisation.
    Parameters whose id is in `exclude` (those another optimizer owns) are left out, and so is an
    empty group (e.g. no decayed matrix beside Muon's): torch.distributed.checkpoint refuses those
    when it saves several optimizers. With a `hidden_lr_scale` (μP) the blocks' matrices get a group
    of their own with that lr_scale (training/optim/lr_scale.py); every other group has lr_scale 1."""
    hidden_ids = {id(p) for p in hidden_matrices(model)} if hidden_lr_scale is not None else set()
    decay, hidden, no_decay, seen = [], [], [], set(exclude)
    for module_name, module in model.named_modules():
        for name, p in module.named_parameters(recurse=False):
            if not p.requires_grad or id(p) in seen:
                continue
            seen.add(id(p))  # a tied head is the embedding: count it once, as an embedding
            is_matrix = isinstance(module, torch.nn.Linear) and name == "weight"
            (hidden if id(p) in hidden_ids else decay if is_matrix else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay, "lr_scale": 1.0},
              {"params": no_decay, "weight_decay": 0.0, "lr_scale": 1.0}]
    if hidden:
        groups.insert(0, scaled_group(hidden, weight_decay, hidden_lr_scale))
    return [group for group in groups if group["params"]]


def hidden_matrices(model: torch.nn.Module) -> list:
    """The 2-D weights inside the transformer blocks (attention and MLP projections): what Muon is for.

    The embedding is a lookup table and the head maps to a vocabulary — neither is a hidden linear
    map whose update should be orthogonalised (Keller Jordan's Muon, nanochat), and a tied head is
    the embedding. Found by module type, so any wrapper (DDP, FSDP2, the loss module) is fine.
    SwiGLU's fused gate_up_proj is orthogonalised as one (2·intermediate, hidden) matrix, not as
    gate and up apart: torch's Muon takes whole 2-D parameters.
    """
    matrices, seen = [], set()
    for block in model.modules():
        if isinstance(block, Block):
            for module in block.modules():
                weight = getattr(module, "weight", None)
                if isinstance(module, torch.nn.Linear) and weight.requires_grad and id(weight) not in seen:
                    seen.add(id(weight))
                    matrices.append(weight)
    return matrices


def build_adamw(groups: list, cfg: OptimConfig, device_type: str) -> torch.optim.AdamW:
    impl = cfg.impl
    if impl == "auto":
        # The fused kernel does the whole update in one pass; CPU and CUDA both have it in torch ≥ 2.4.
        impl = "fused" if device_type in ("cpu", "cuda") else "foreach"
    kwargs = {"fused": True} if impl == "fused" else {"foreach": impl == "foreach"}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, **kwargs)
