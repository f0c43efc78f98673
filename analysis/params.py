"""Exact parameter counts of a run's model, computed from its config without allocating any weights."""

from typing import Dict

import torch

from model import ModelConfig, Transformer


def model_params(model_config: dict) -> Dict[str, int]:
    """Transformer.param_counts() plus the resolved intermediate_size, built on the meta device
    (shapes only, no memory), so the numbers are the model's own accounting, not a formula."""
    cfg = ModelConfig(**model_config)
    with torch.device("meta"):
        counts = Transformer(cfg).param_counts()
    # unset in the config means derived: 8/3·d rounded up for gated MLPs, 4·d for the others
    return {**counts, "intermediate_size": cfg.resolved_intermediate_size}
