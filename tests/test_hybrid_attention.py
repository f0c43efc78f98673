"""model/hybrid_attention.py: SDPA's forward with a matmul backward is SDPA's function, values and gradients, in
float64; the default (auto) traces it in every layer of a compiled bf16 CPU model and trains as eager SDPA does."""
import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, Transformer
from model.hybrid_attention import hybrid_attention


@pytest.mark.parametrize("n_heads, n_kv_heads, scale", [(4, 4, None), (4, 2, None), (4, 1, 0.3)])  # MHA, GQA, MQA+μP
def test_hybrid_attention_is_sdpas_function_with_its_gradients(n_heads, n_kv_heads, scale):
    """In float64 the output and the gradients of q, k and v (grouped k/v heads summing their queries') equal causal
    SDPA's; torch.autograd.gradcheck holds the hand-written backward to finite differences as well."""
    gen = torch.Generator().manual_seed(0)
    T, hd = 7, 8
    q = torch.randn(2, n_heads, T, hd, generator=gen, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(2, n_kv_heads, T, hd, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(2))
    grad_out = torch.randn(2, n_heads, T, hd, generator=gen, dtype=torch.float64)
    ours = hybrid_attention(q, k, v, scale)
    ours_grads = torch.autograd.grad(ours, (q, k, v), grad_out)
    sdpa = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=n_kv_heads != n_heads, scale=scale)
    sdpa_grads = torch.autograd.grad(sdpa, (q, k, v), grad_out)
    torch.testing.assert_close(ours, sdpa, rtol=1e-12, atol=1e-12)
    for mine, theirs in zip(ours_grads, sdpa_grads):
        torch.testing.assert_close(mine, theirs, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda *qkv: hybrid_attention(*qkv, scale), (q, k, v))


@pytest.mark.parametrize("compiled", [False, True])
def test_hybrid_attentions_bf16_gradients_are_as_accurate_as_sdpas(compiled):
    """In bf16, at logits of a trained model's size (std ~2), the hybrid's q, k and v gradients are within 1.25× of
    SDPA's own bf16 error against float64 on the same inputs — eager, and compiled (aot_eager) under bf16 autocast
    as a training step runs it. Recomputing the scores or dP in bf16 (rounded before the exp, and before
    dP − rowsum(dO ∘ O) cancels) made it ~3× SDPA's; so did leaving the forward's autocast on in the compiled
    backward, which ran its fp32 matmuls in bf16."""
    gen = torch.Generator().manual_seed(0)
    q, k = ((torch.randn(2, 2, 128, 32, generator=gen) * 1.4).bfloat16().requires_grad_() for _ in range(2))
    v = torch.randn(2, 2, 128, 32, generator=gen).bfloat16().requires_grad_()
    grad_out = torch.randn(2, 2, 128, 32, generator=gen).bfloat16()
    exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
    truth = torch.autograd.grad(F.scaled_dot_product_attention(*exact, is_causal=True), exact, grad_out.double())

    def error(out):  # the worst relative error of the three gradients
        return max(float((g.double() - t).norm() / t.norm()) for g, t in zip(torch.autograd.grad(out, (q, k, v), grad_out), truth))
    sdpa_error = error(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    torch._dynamo.reset()
    try:
        attend = torch.compile(hybrid_attention, backend="aot_eager") if compiled else hybrid_attention
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=compiled):
            out = attend(q, k, v, None)
        assert error(out) < 1.25 * sdpa_error
    finally:
        torch._dynamo.reset()


def test_compiled_auto_attention_is_hybrid_and_trains_as_eager_sdpa(monkeypatch):
    """The default kernel (auto) in a compiled bf16 CPU model traces hybrid_attention in every layer, on any CPU
    class (no AMX exception), and the logits and every parameter's gradient are eager SDPA's to bf16 rounding,
    finite; GQA included. In fp32 it is SDPA. The kernel is chosen while dynamo traces, whatever the backend, so
    aot_eager (the autograd graph, no C++ compile) checks it; inductor's own compile of it is
    test_attention.py's test_the_default_attention_trains_finite_compiled_in_bf16_on_this_cpu_whatever_its_class."""
    import model.attention as attention_module
    traced = []
    real = attention_module.hybrid_attention
    monkeypatch.setattr(attention_module, "hybrid_attention", lambda *a, **k: traced.append(1) or real(*a, **k))
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=256, hidden_size=64, n_layers=2, n_heads=2, n_kv_heads=1, max_seq_len=64, multiple_of=32)
    model = Transformer(cfg).train()
    x = torch.randint(0, 256, (2, 64))

    def logits_and_grads(forward):
        model.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = forward(x).float()
        logits.logsumexp(-1).mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    eager, eager_grads = logits_and_grads(model)
    assert traced == []  # eager: SDPA
    torch._dynamo.reset()
    try:
        compiled, compiled_grads = logits_and_grads(torch.compile(model, backend="aot_eager"))
        assert len(traced) == cfg.n_layers
        torch._dynamo.reset()
        torch.compile(model, backend="eager")(x)  # fp32: SDPA's fused kernel stays
    finally:
        torch._dynamo.reset()
    assert len(traced) == cfg.n_layers
    torch.testing.assert_close(compiled, eager, rtol=0.05, atol=0.05)
    for name, grad in compiled_grads.items():
        assert torch.isfinite(grad).all(), name
        scale = eager_grads[name].abs().max()
        torch.testing.assert_close(grad, eager_grads[name], rtol=0.05, atol=0.05 * float(scale), msg=name)
