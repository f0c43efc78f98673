"""The training objective: CausalLMLoss wraps the Transformer (model + head + fp32 cross-entropy as one
module, for compile, DDP and FSDP2), with a chunked cross-entropy that never holds the full logits."""
from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100  # targets with this value are not scored (padding, masked prompts)
# Chunk above 2^26 logits elements (B·T·vocab): 256 MB in fp32, e.g. 16 × 1024 tokens at vocab 4096.
# Below it the one-shot path is as fast and simpler; above it the fp32 copies (logits, log-softmax,
# their gradients) dominate a step's memory: 32 × 1024 × 32k is 4 GB per copy.
DEFAULT_CHUNK_ABOVE = 2 ** 26
# Each chunk holds about this many fp32 logits (64 MB): 512 tokens at vocab 32k, big enough for
# well-shaped matmuls, small enough that the transient is noise next to the activations.
CHUNK_ELEMENTS = 2 ** 24


class CausalLMLoss(nn.Module):
    """forward(input_ids, targets) → fp32 mean cross-entropy over targets != -100.

    The one module train and eval call, so the loss fuses with the LM head under torch.compile,
    and, as the root of FSDP2, the unit that owns embedding, final norm and head during the loss.
    `chunk_above`: B·T·vocab above which the chunked cross-entropy is used: "auto" (2^26), an
    integer (0 = always), or None (never).
    """

    def __init__(self, model: nn.Module, chunk_above: Union[str, int, None] = "auto",
                 chunk_elements: int = CHUNK_ELEMENTS):
        super().__init__()
        if chunk_above == "auto":
            chunk_above = DEFAULT_CHUNK_ABOVE
        if chunk_above is not None and (not isinstance(chunk_above, int) or chunk_above < 0):
            raise ValueError(f"chunk_above={chunk_above!r} must be 'auto', an integer >= 0 (0 = always chunk) "
                             "or None (never)")
        if chunk_elements <= 0:
            raise ValueError(f"chunk_elements={chunk_elements} must be > 0")
        self.model = model
        self.chunk_above, self.chunk_elements = chunk_above, chunk_elements

    def chunk_tokens(self, n_tokens: int, vocab_size: int) -> Optional[int]:
        """Tokens per chunk for this batch, or None for the one-shot cross-entropy."""
        if self.chunk_above is None or n_tokens * vocab_size <= self.chunk_above:
            return None
        return max(1, min(n_tokens, self.chunk_elements // vocab_size))

    def forward(self, input_ids: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # (B, T, D), final-normed, × mup's output multiplier: the head's input on both paths below
        hidden = self.model.lm_head_input(self.model.hidden_states(input_ids))
        head = self.model.lm_head
        chunk = self.chunk_tokens(targets.numel(), head.weight.shape[0])
        if chunk is None:
            logits = head(hidden)  # (B, T, V); bf16 under autocast
            return cross_entropy(logits.flatten(0, 1), targets.flatten())
        return chunked_cross_entropy(hidden.flatten(0, 1), head.weight, targets.flatten(), chunk)


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """mean over targets != -100 of cross_entropy(logits, targets), the softmax in fp32 (a bf16 log-softmax
    rounds away the probabilities of rare tokens). logits (N, V) in any float dtype, targets (N,).

    Compiled on a CPU it is _CrossEntropy, whose backward is one elementwise pass; eagerly, and on other devices
    (not measured there), torch's own kernels. Compiled on a CPU, F.cross_entropy's backward recomputed the
    log-softmax and compared 64-bit column indices for its one-hot: that kernel took 10.3 ms of the default step
    on an AMX Xeon, this backward 6.0 (BENCHMARKS.md, "The loss's backward in one pass"). Both are the float64
    cross-entropy within fp32 rounding (tests/test_loss.py)."""
    if logits.device.type == "cpu" and torch.compiler.is_compiling():
        return _CrossEntropy.apply(logits, targets)
    return F.cross_entropy(logits.float(), targets, ignore_index=IGNORE_INDEX)


class _CrossEntropy(torch.autograd.Function):
    """The forward keeps (N,) logsumexps and the logits it was given; the backward is (softmax − one-hot) ×
    valid / n_valid in one elementwise pass, returned in the logits' dtype (where the plain loss casts it too)."""

    @staticmethod
    def forward(ctx, logits, targets):
        wide = logits.to(torch.promote_types(logits.dtype, torch.float32))
        valid = targets != IGNORE_INDEX
        safe_targets = targets.masked_fill(~valid, 0)
        logsumexp = torch.logsumexp(wide, dim=-1)
        target_logit = wide.gather(1, safe_targets[:, None]).squeeze(1)
        n_valid = valid.sum()
        ctx.save_for_backward(logits, safe_targets, valid, logsumexp, n_valid)
        return ((logsumexp - target_logit) * valid).sum() / n_valid

    @staticmethod
    def backward(ctx, grad_loss):
        logits, safe_targets, valid, logsumexp, n_valid = ctx.saved_tensors
        acc = logsumexp.dtype
        # The one-hot compared in int32: with 64-bit indices (F.cross_entropy's) the compare cost as much as the exp.
        columns = torch.arange(logits.shape[1], device=logits.device, dtype=torch.int32)
        one_hot = (columns[None, :] == safe_targets.to(torch.int32)[:, None]).to(acc)
        row_scale = valid.to(acc) * grad_loss / n_valid  # (N,): the mean's weight of each scored row
        grad = (torch.exp(logits.to(acc) - logsumexp[:, None]) - one_hot) * row_scale[:, None]
        return grad.to(logits.dtype), None


def chunked_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                          chunk_tokens: int) -> torch.Tensor:
    """mean over targets != -100 of cross_entropy(hidden @ weight.T, targets), `chunk_tokens` rows at a time.

    hidden (N, D), weight (V, D), targets (N,). Under autocast the matmuls run in the autocast dtype
    and the softmax in fp32, as the one-shot path does. With gradients on, each chunk's gradient is
    computed right away (softmax − one-hot is all it needs), so neither pass holds N × V logits.
    """
    device_type = hidden.device.type
    compute_dtype = torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else weight.dtype
    needs_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    with torch.autocast(device_type, enabled=False):  # the dtypes are explicit inside
        return _ChunkedCrossEntropy.apply(hidden, weight, targets, chunk_tokens, compute_dtype, needs_grad)


class _ChunkedCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_tokens, compute_dtype, needs_grad):
        w = weight.to(compute_dtype)  # (V, D)
        acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # softmax and sums: fp32 at least
        valid = targets != IGNORE_INDEX  # (N,)
        # The mean's denominator is known up front, so each chunk's gradient is final when computed.
        row_scale = valid.to(acc_dtype) / valid.sum()  # (N,)
        safe_targets = targets.masked_fill(~valid, 0)
        loss = hidden.new_zeros((), dtype=acc_dtype)
        grad_hidden = torch.empty_like(hidden) if needs_grad else None
        grad_weight = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if needs_grad else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h = hidden[rows].to(compute_dtype)  # (n, D)
            logits = (h @ w.T).to(acc_dtype)  # (n, V): the only chunk-sized fp32 buffer
            lse = torch.logsumexp(logits, dim=-1)  # (n,)
            target_logit = logits.gather(1, safe_targets[rows, None]).squeeze(1)
            loss = loss + ((lse - target_logit) * row_scale[rows]).sum()
            if not needs_grad:
                continue
            # d(mean CE)/d logits = (softmax − one-hot) × valid / n_valid, built in place in the buffer.
            grad = logits.sub_(lse[:, None]).exp_()
            grad.scatter_add_(1, safe_targets[rows, None], grad.new_full((grad.shape[0], 1), -1.0))
            grad = grad.mul_(row_scale[rows, None]).to(compute_dtype)
            grad_hidden[rows] = (grad @ w).to(hidden.dtype)
            # Summed over chunks in fp32, rounded once at the end (as one big matmul would be).
            grad_weight += (grad.T @ h).to(acc_dtype)
        if needs_grad:
            ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        grad_hidden, grad_weight = ctx.saved_tensors
        return grad_hidden * grad_loss, grad_weight * grad_loss, None, None, None, None
