"""Causal attention for compiled CPU training: SDPA's fused forward, and a backward of plain matmuls that
recomputes the attention weights from the forward's saved logsumexp (FlashAttention's backward, unblocked).

Why: torch's CPU flash kernel is fast forward but its bf16 backward is not (on an AMX Xeon, 2026-12-05, 16 × 3 heads
× 256 × 64: 2.8 ms forward, 22.5 ms backward; this backward 15 ms — scripts/bench_attention.py).
Written as matmuls and elementwise maths, inductor fuses the backward's softmax algebra around them: the scores
and dP in fp32 (as flash computes them), the three gradient products with bf16 operands.
"""
from typing import Optional

import torch


class _SdpaForwardMatmulBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
        # (B, H, T, hd) each; logsumexp (B, H, T) of the scaled, masked scores, fp32 (or the inputs' float64)
        out, logsumexp = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, True, scale=scale)
        ctx.save_for_backward(q, k, v, out, logsumexp)
        ctx.scale = scale
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, out, logsumexp = ctx.saved_tensors
        T = q.shape[-2]
        acc = torch.promote_types(q.dtype, torch.float32)
        # Autocast off: compiled, this backward is traced under the forward's autocast, which would run the fp32
        # matmuls below in bf16; the dtypes here are chosen by hand. The scores and dP = dO vᵀ in fp32, as the flash
        # kernel accumulates them: from bf16-rounded scores, exp(s − logsumexp) is off by up to ~2 % at |s| ~ 5, and
        # dP − rowsum(dO ∘ O) cancels: in bf16 both tripled the gradients' error against float64
        # (tests/test_hybrid_attention.py holds it to SDPA's, compiled under autocast as training runs it).
        with torch.autocast(q.device.type, enabled=False):
            scores = (q.to(acc) @ k.to(acc).transpose(-2, -1)) * ctx.scale  # (B, H, T, T)
            visible = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
            weights = torch.exp(scores - logsumexp.unsqueeze(-1)).masked_fill(~visible, 0.0)  # the forward's softmax
            grad_v = weights.to(v.dtype).transpose(-2, -1) @ grad_out  # bf16 operands, as the flash backward's
            grad_weights = grad_out.to(acc) @ v.to(acc).transpose(-2, -1)
            # softmax's backward: dS = P ∘ (dP − rowsum(dO ∘ O)); rowsum(dP ∘ P) = rowsum(dO ∘ O): no (T, T) pass
            row = (grad_out.to(acc) * out.to(acc)).sum(-1, keepdim=True)  # (B, H, T, 1)
            grad_scores = (weights * (grad_weights - row) * ctx.scale).to(q.dtype)
            return grad_scores @ k, grad_scores.transpose(-2, -1) @ q, grad_v, None


def hybrid_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: Optional[float]) -> torch.Tensor:
    """Causal softmax(q kᵀ · scale) v for T queries over the same T keys (training: no cache, no dropout), on a CPU.
    q (B, H, T, hd); k, v (B, H_kv, T, hd): grouped-query heads are repeated here, so their gradients sum back."""
    n_rep = q.shape[1] // k.shape[1]
    if n_rep > 1:
        k, v = k.repeat_interleave(n_rep, dim=1), v.repeat_interleave(n_rep, dim=1)
    return _SdpaForwardMatmulBackward.apply(q, k, v, q.shape[-1] ** -0.5 if scale is None else scale)
