"""minillama's model: a LLaMA-style decoder (RMSNorm, RoPE attention, SwiGLU) with ablation variants."""
from model.attention import Attention
from model.config import ModelConfig
from model.kv_cache import KVCache
from model.mlp import MLPS, GeGLU, GeluMLP, ReLU2MLP, SwiGLU, swiglu_intermediate_size
from model.norm import NORMS, LayerNorm, NoNorm, RMSNorm, RMSNormBF16
from model.rope import apply_rope, rope_tables
from model.rounding import find_multiple
from model.transformer import Block, Transformer

__all__ = ["Attention", "Block", "GeGLU", "GeluMLP", "KVCache", "LayerNorm", "MLPS", "ModelConfig", "NORMS", "NoNorm",
           "ReLU2MLP", "RMSNorm", "RMSNormBF16", "SwiGLU", "Transformer", "apply_rope", "find_multiple", "rope_tables",
           "swiglu_intermediate_size"]
