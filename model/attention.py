"""Causal self-attention with RoPE, grouped-query heads, optional QK-norm, SDPA or plain matmuls, and a KV cache."""
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from model.config import ModelConfig
from model.hybrid_attention import hybrid_attention
from model.kv_cache import KVCache
from model.norm import NoNorm, RMSNorm
from model.parametrization import attention_scale
from model.rope import apply_rope


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.resolved_n_kv_heads, cfg.head_dim
        # Separate q/k/v projections (no biases, as LLaMA) keep the HF weight names one-to-one.
        self.q_proj = nn.Linear(cfg.hidden_size, self.n_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.hidden_size, self.n_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, cfg.hidden_size, bias=False)
        # QK-norm (OLMo-2, Qwen3): RMSNorm over each head's head_dim, one weight shared by all heads,
        # so attention logits cannot grow without bound as q and k weights grow. Always RMSNorm:
        # the model.norm ablation is about the residual-stream norms.
        norm_cls = RMSNorm if cfg.qk_norm else NoNorm
        self.q_norm = norm_cls(self.head_dim, eps=cfg.norm_eps)
        self.k_norm = norm_cls(self.head_dim, eps=cfg.norm_eps)
        self.dropout = cfg.dropout
        # None: SDPA's 1/sqrt(head_dim) (sp). mup: ∝ 1/head_dim, as q and k grow correlated with width.
        self.scale = attention_scale(cfg)
        self.kernel = cfg.attention_kernel
        self.zero_query = cfg.zero_query_init

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                cache: Optional[KVCache] = None) -> torch.Tensor:
        """x (B, T, D); cos/sin (T, head_dim) rows for these T positions; cache holds earlier ones."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim)
        q, k = self.q_norm(q), self.k_norm(k)  # identity unless qk_norm; before RoPE, as Qwen3
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (B, heads, T, head_dim)

        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.update(self.layer_idx, k, v)  # (B, n_kv_heads, past + T, head_dim)
        dropout_p = self.dropout if self.training else 0.0
        kernel = kernel_for(self.kernel, q, past, dropout_p)
        if kernel == "hybrid":
            out = hybrid_attention(q, k, v, self.scale)  # (B, n_heads, T, head_dim)
        elif kernel == "matmul":
            out = matmul_attention(q, k, v, self.scale, dropout_p)  # (B, n_heads, T, head_dim)
        else:
            sdpa = _sdpa_outside_compile if dropout_p and x.device.type == "cpu" else F.scaled_dot_product_attention
            out = sdpa(
                q, k, v,
                attn_mask=_causal_mask(T, past, x.device),
                is_causal=past == 0 and T > 1,
                dropout_p=dropout_p,
                # Each group of n_heads/n_kv_heads query heads shares one k/v head.
                enable_gqa=self.n_kv_heads != self.n_heads,
                scale=self.scale,
            )  # (B, n_heads, T, head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, self.n_heads * self.head_dim))

    def init_weights(self, std: float, out_std: float) -> None:
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.normal_(proj.weight, mean=0.0, std=std)
        if self.zero_query:  # every score 0 at init, attention uniform (μP's TP5, Appendix D.2); after k and v's draws
            nn.init.zeros_(self.q_proj.weight)
        nn.init.normal_(self.o_proj.weight, mean=0.0, std=out_std)  # writes into the residual stream
        self.q_norm.init_weights(std, out_std)
        self.k_norm.init_weights(std, out_std)


# Up to this many keys, "auto" attends with plain matmuls in a compiled bf16 CPU model that trains with attention
# dropout (BENCHMARKS.md, "The bf16 step's levers"): the (T, T) scores are small, inductor fuses scale, mask, softmax
# and dropout around two bf16 GEMMs, where SDPA's dropout must run eagerly on a CPU (_sdpa_outside_compile); the
# default step ran 1.05x faster than SDPA at T = 256, head_dim 64, but 0.96x at T = 512, and in fp32 0.96x.
MATMUL_ATTENTION_MAX_KEYS = 256


def compiled_matmul_attention_is_finite_here() -> bool:
    """False on CPUs with AMX tiles: there torch 2.13's inductor compiles the backward of RoPE'd k under matmul
    attention (bf16 autocast) into a tiled-transpose kernel whose output holds NaN — every k_proj gradient, from
    the first step (found on an Intel Xeon with AMX, 2026-12-05; oneDNN's ISA cap does not change it, inductor's
    simdlen=256 does). "auto" keeps SDPA on them (BENCHMARKS.md, "The same on AMX").
    The hardware's flag, not oneDNN's class: the fault is in inductor's generated code."""
    return not _AMX_TILES


_AMX_TILES = torch.cpu._is_amx_tile_supported()  # read once, outside any trace

# The hybrid's backward holds a few (B, H, T, T) fp32 tensors at once, where SDPA's flash backward holds none: above
# this many scores (256 MB each; the default step has 3.1M) "auto" keeps SDPA, the loss's chunking threshold too.
HYBRID_MAX_SCORES = 2 ** 26


def kernel_for(kernel: str, q: torch.Tensor, past: int, dropout_p: float) -> str:
    """Which function attends these queries (q (B, H, T, hd), after `past` cached keys): "hybrid", "matmul" or
    "sdpa". auto, while torch.compile traces a CPU model whose q is bf16 (autocast):
      - hybrid (model/hybrid_attention.py) for training and evaluation without a cache or dropout, up to
        HYBRID_MAX_SCORES scores — SDPA's forward, a backward of matmuls; attention 1.41x faster than SDPA's on
        AMX, as accurate (BENCHMARKS.md, "Attention: SDPA's forward, a matmul backward");
      - matmul with attention dropout over <= MATMUL_ATTENTION_MAX_KEYS keys where that compiles to finite
        gradients (dropout inside the graph, not SDPA's eager workaround);
      - sdpa otherwise, and always eager, in fp32 and on GPUs (fused kernels that materialise no scores).
    A kernel named explicitly is used as named, except hybrid where it cannot run (a cache, dropout, not a
    CPU): there SDPA, which computes the same function."""
    hybrid_fits = q.device.type == "cpu" and past == 0 and not dropout_p
    if kernel == "auto":
        if not (q.device.type == "cpu" and q.dtype == torch.bfloat16 and torch.compiler.is_compiling()):
            return "sdpa"
        if hybrid_fits and q.shape[:-1].numel() * q.shape[-2] <= HYBRID_MAX_SCORES:
            return "hybrid"
        if past + q.shape[-2] <= MATMUL_ATTENTION_MAX_KEYS and compiled_matmul_attention_is_finite_here():
            return "matmul"
        return "sdpa"
    if kernel == "hybrid" and not hybrid_fits:
        return "sdpa"
    return kernel


def matmul_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float],
                     dropout_p: float = 0.0) -> torch.Tensor:
    """SDPA's causal attention as two matmuls: softmax(q kᵀ · scale, causal) v, the softmax in fp32, and
    dropout on the attention weights as SDPA applies it (compiled too: no graph break, unlike SDPA's on a CPU).

    q (B, H, T, hd); k, v (B, H_kv, S, hd) with S >= T: the T queries are the last T positions (a cache's
    earlier keys are all visible, bottom-right aligned). The scores round to the matmul's dtype first, as
    Hugging Face's eager Llama attention does; the softmax and its backward are fp32.
    """
    T, S, n_rep = q.shape[-2], k.shape[-2], q.shape[1] // k.shape[1]
    if n_rep > 1:  # grouped-query heads: each k/v head serves n_rep consecutive query heads, as SDPA's enable_gqa
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    softmax_dtype = torch.promote_types(q.dtype, torch.float32)  # fp32 at least (float64 stays float64)
    scores = (q @ k.transpose(-2, -1)).to(softmax_dtype) * (q.shape[-1] ** -0.5 if scale is None else scale)
    visible = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    weights = torch.softmax(scores.masked_fill(~visible, float("-inf")), dim=-1)
    if dropout_p:
        weights = F.dropout(weights, dropout_p)
    return weights.to(v.dtype) @ v


@torch.compiler.disable
def _sdpa_outside_compile(*args, **kwargs) -> torch.Tensor:
    """SDPA with attention dropout, run eagerly even in a compiled model. torch 2.13's inductor on CPU turns
    its backward under bf16 autocast into NaN gradients for q and k (tests/test_attention.py reproduces it);
    eager SDPA is exact. One graph break per layer, only when training with dropout on a CPU."""
    return F.scaled_dot_product_attention(*args, **kwargs)


def _causal_mask(T: int, past: int, device: torch.device) -> Optional[torch.Tensor]:
    """None when SDPA's own masking is right: no cache (is_causal) or one new token (sees all).

    For T > 1 new tokens after `past` cached ones, SDPA's is_causal would align the triangle to
    the top-left and hide cached keys, so build the bottom-right-aligned mask explicitly.
    """
    if past == 0 or T == 1:
        return None
    q_pos = torch.arange(past, past + T, device=device)[:, None]
    k_pos = torch.arange(past + T, device=device)[None, :]
    return k_pos <= q_pos  # (T, past + T), True = may attend


# ---- diagnostics: the attention logits (coordinate check, the validator's per-layer RMS) ------------------

def attention_logits(attn: Attention, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
                     sin: torch.Tensor) -> torch.Tensor:
    """The causal entries of q·kᵀ × the attention's scale, as Attention.forward computes them (q and k as its
    norms leave them, (B, T, heads, head_dim); RoPE applied here): a flat tensor."""
    q, k = apply_rope(q, cos, sin).transpose(1, 2), apply_rope(k, cos, sin).transpose(1, 2)  # (B, H, T, hd)
    k = k.repeat_interleave(attn.n_heads // attn.n_kv_heads, dim=1)  # grouped-query heads share k
    scale = attn.scale if attn.scale is not None else attn.head_dim ** -0.5  # None: SDPA's default
    logits = (q @ k.transpose(-2, -1)) * scale  # (B, H, T, T)
    T = logits.shape[-1]
    return logits[..., torch.ones(T, T, dtype=torch.bool, device=logits.device).tril()].flatten()


def hook_attention_logits(attn: Attention, record: Callable[[torch.Tensor], None], rows: Optional[int] = None) -> list:
    """Forward hooks that pass `record` the attention logits of each forward of `attn` (of its first `rows`
    sequences if given: a (B, H, T, T) tensor of a large batch is big); the caller removes the returned handles.
    Hooks on the uncompiled module only, no cache (the logits of cached keys are not recomputed)."""
    seen = {}
    return [attn.q_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("q", out[:rows])),
            attn.k_norm.register_forward_hook(lambda m, a, out: seen.__setitem__("k", out[:rows])),
            attn.register_forward_hook(lambda m, a, out: record(attention_logits(m, seen["q"], seen["k"], a[1], a[2])))]
