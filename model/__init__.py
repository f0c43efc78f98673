"""minillama's model: a LLaMA-style decoder (RMSNorm, RoPE attention, SwiGLU) with the ablation variants."""

from importlib import import_module

# Each name from its module, imported on first use: the config alone (a data preparation's) never loads torch.
_MODULES = {
    "model.attention": ("Attention", "KVCache", "apply_rope", "rope_tables"),
    "model.config": ("ModelConfig", "find_multiple"),
    "model.mlp": ("MLPS", "GeGLU", "GeluMLP", "ReLU2MLP", "SwiGLU", "swiglu_intermediate_size"),
    "model.norm": ("NORMS", "LayerNorm", "NoNorm", "RMSNorm", "RMSNormBF16"),
    "model.transformer": ("Block", "Transformer"),
}
_WHERE = {name: module for module, names in _MODULES.items() for name in names}


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'model' has no attribute {name!r}")
    return getattr(import_module(_WHERE[name]), name)


__all__ = sorted(_WHERE)
