"""minillama's model: a LLaMA-style decoder (RMSNorm, RoPE attention, SwiGLU) with the ablation variants."""

from model.attention import Attention, KVCache, apply_rope, rope_tables
from model.config import ModelConfig, find_multiple
from model.mlp import MLPS, GeGLU, GeluMLP, ReLU2MLP, SwiGLU, swiglu_intermediate_size
from model.norm import NORMS, LayerNorm, NoNorm, RMSNorm, RMSNormBF16
from model.transformer import Block, Transformer

__all__ = [
    "Attention",
    "Block",
    "GeGLU",
    "GeluMLP",
    "KVCache",
    "LayerNorm",
    "MLPS",
    "ModelConfig",
    "NORMS",
    "NoNorm",
    "ReLU2MLP",
    "RMSNorm",
    "RMSNormBF16",
    "SwiGLU",
    "Transformer",
    "apply_rope",
    "find_multiple",
    "rope_tables",
    "swiglu_intermediate_size",
]
