"""Attention against a hand-written float64 reference (with and without QK-norm); GQA equals MHA with
repeated kv heads; causality; QK-norm's scale invariance."""
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from model import ModelConfig, Transformer, rope_tables
from model.attention import Attention
from model_helpers import one_thread, random_transformer, reference_attention, tiny_model_config


@pytest.mark.parametrize("n_kv_heads, qk_norm", [(4, False), (2, False), (1, False), (2, True)])  # MHA, GQA, MQA
def test_attention_matches_reference(n_kv_heads, qk_norm):
    torch.manual_seed(0)
    # A QK-norm eps far from the default: a norm built without model.norm_eps would show.
    cfg = tiny_model_config(n_kv_heads=n_kv_heads, qk_norm=qk_norm, norm_eps=0.05)
    attn = Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():  # QK-norm weights off their ones, so a swapped or skipped weight shows
        for p in list(attn.q_norm.parameters()) + list(attn.k_norm.parameters()):
            p.add_(0.3 * torch.randn_like(p))
    cos, sin = rope_tables(cfg.head_dim, 12)
    x = torch.randn(2, 12, cfg.hidden_size)
    torch.testing.assert_close(attn(x, cos, sin).double(), reference_attention(attn, x, cos, sin, cfg.norm_eps),
                               rtol=1e-5, atol=1e-5)


def test_gqa_equals_mha_with_repeated_kv_heads():
    torch.manual_seed(0)
    gqa_cfg = tiny_model_config(n_heads=4, n_kv_heads=2)
    mha_cfg = tiny_model_config(n_heads=4, n_kv_heads=None)
    assert mha_cfg.resolved_n_kv_heads == 4
    gqa, mha = Attention(gqa_cfg, 0).eval(), Attention(mha_cfg, 0).eval()
    hd, n_rep = gqa_cfg.head_dim, 2
    with torch.no_grad():
        mha.q_proj.weight.copy_(gqa.q_proj.weight)
        mha.o_proj.weight.copy_(gqa.o_proj.weight)
        for name in ("k_proj", "v_proj"):
            w = getattr(gqa, name).weight.view(2, hd, -1)  # (n_kv_heads, head_dim, hidden)
            getattr(mha, name).weight.copy_(w.repeat_interleave(n_rep, dim=0).reshape(4 * hd, -1))
    cos, sin = rope_tables(hd, 10)
    x = torch.randn(3, 10, gqa_cfg.hidden_size)
    torch.testing.assert_close(gqa(x, cos, sin), mha(x, cos, sin), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("autocast, qk_norm", [(False, False), (True, False), (False, True)])
def test_future_tokens_never_change_past_logits(autocast, qk_norm):
    cfg = tiny_model_config(qk_norm=qk_norm)
    model = random_transformer(cfg)
    torch.manual_seed(1)
    ids = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with one_thread(), torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        base = model(ids).float()
        for t in (1, 7, cfg.max_seq_len - 1):
            changed = ids.clone()
            changed[:, t] = (changed[:, t] + 1) % cfg.vocab_size
            logits = model(changed).float()
            torch.testing.assert_close(logits[:, :t], base[:, :t], rtol=0, atol=1e-6,
                                       msg=f"changing token {t} moved an earlier logit")
            assert not torch.allclose(logits[:, t], base[:, t])  # the change is visible where it may be


def test_attention_dropout_only_in_training():
    torch.manual_seed(0)
    cfg = tiny_model_config(dropout=0.5)
    attn = Attention(cfg, 0)
    cos, sin = rope_tables(cfg.head_dim, 6)
    x = torch.randn(2, 6, cfg.hidden_size)
    assert not torch.equal(attn(x, cos, sin), attn(x, cos, sin))
    attn.eval()
    assert torch.equal(attn(x, cos, sin), attn(x, cos, sin))


def test_qk_norm_makes_attention_blind_to_the_scale_of_q_and_k():
    """The point of QK-norm: logits cannot grow with the q/k weights (OLMo-2's stability argument)."""
    torch.manual_seed(0)
    cos, sin = rope_tables(8, 6)
    x = torch.randn(2, 6, 32)
    for qk_norm in (True, False):
        attn = Attention(tiny_model_config(qk_norm=qk_norm), 0).eval()
        before = attn(x, cos, sin)
        with torch.no_grad():
            attn.q_proj.weight.mul_(30.0)
            attn.k_proj.weight.mul_(3.0)
        after = attn(x, cos, sin)
        assert torch.allclose(after, before, atol=1e-4) == qk_norm


def _compiled_bf16_grads_finite(kernel: str = "sdpa", dropout: float = 0.1) -> bool:
    """Train one step of a compiled 1-layer model with attention dropout under bf16 autocast on the CPU."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    try:
        cfg = ModelConfig(vocab_size=256, hidden_size=64, n_layers=1, n_heads=1, dropout=dropout, max_seq_len=64,
                          multiple_of=32, attention_kernel=kernel)
        model = Transformer(cfg).train()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = torch.compile(model)(torch.randint(0, 256, (2, 64)))
        logits.float().logsumexp(-1).mean().backward()
        return all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    finally:
        torch._dynamo.reset()


def _graph_breaks(cfg: ModelConfig, bf16: bool = False) -> dict:
    """{train, eval, no dropout: [dynamo's graph-break reasons]} of a model of `cfg` on a CPU batch (under bf16
    autocast if `bf16`)."""
    x = torch.randint(0, 256, (2, 64))
    breaks = {}
    for name, model in (("train", Transformer(cfg).train()), ("eval", Transformer(cfg).eval()),
                        ("no dropout", Transformer(replace(cfg, dropout=0.0)).train())):
        torch._dynamo.reset()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            explained = torch._dynamo.explain(model)(x)
        breaks[name] = [str(r.reason) for r in explained.break_reasons]
    torch._dynamo.reset()
    return breaks


def test_attention_dropout_runs_outside_the_compiled_graph_on_a_cpu_and_trains_finite():
    """The workaround for inductor's NaN-gradient bug (model/attention.py), on every machine: with dropout,
    training on a CPU, SDPA is a graph break (run eagerly); without dropout, or in eval, it stays in the graph;
    and compiled bf16 training with dropout gives finite gradients."""
    cfg = ModelConfig(vocab_size=256, hidden_size=64, n_layers=2, n_heads=1, dropout=0.1, max_seq_len=64, multiple_of=32,
                      attention_kernel="sdpa")
    breaks = _graph_breaks(cfg)
    assert len(breaks["train"]) == cfg.n_layers and all("_sdpa_outside_compile" in r for r in breaks["train"])
    assert breaks["eval"] == breaks["no dropout"] == []
    assert _compiled_bf16_grads_finite("sdpa")


def test_auto_attention_compiles_dropout_into_the_graph_on_a_cpu_where_matmul_attention_is_finite(monkeypatch):
    """attention_kernel=auto in a compiled bf16 CPU model, on a CPU without inductor's AMX fault (faked, so every
    class checks it): matmul attention, its dropout inside the graph (no break, no eager SDPA) — the case the
    workaround above costs a graph break per layer. Where the fault is (AMX tiles), auto is SDPA and its workaround."""
    import model.attention as attention_module
    cfg = ModelConfig(vocab_size=256, hidden_size=64, n_layers=2, n_heads=1, dropout=0.1, max_seq_len=64, multiple_of=32)
    assert cfg.attention_kernel == "auto"
    monkeypatch.setattr(attention_module, "compiled_matmul_attention_is_finite_here", lambda: True)
    assert _graph_breaks(cfg, bf16=True) == {"train": [], "eval": [], "no dropout": []}
    monkeypatch.setattr(attention_module, "compiled_matmul_attention_is_finite_here", lambda: False)
    breaks = _graph_breaks(cfg, bf16=True)
    assert len(breaks["train"]) == cfg.n_layers and all("_sdpa_outside_compile" in r for r in breaks["train"])


def test_the_default_attention_trains_finite_compiled_in_bf16_on_this_cpu_whatever_its_class():
    """What a user's compiled bf16 run gets from attention_kernel=auto (the default's dropout, 0) on the machine the
    suite runs on: finite gradients — matmul attention where it is finite, SDPA on a CPU with AMX tiles, where
    inductor's compiled matmul attention gave NaN k_proj gradients from the first step. (With dropout, SDPA's
    eager workaround above is what runs there.)"""
    assert _compiled_bf16_grads_finite("auto", dropout=0.0)


def test_the_bug_the_workaround_avoids_where_it_reproduces(monkeypatch):
    """torch 2.13's inductor on some CPUs turns SDPA's backward with dropout under bf16 autocast into NaN gradients
    for q and k (seen on an AMX Xeon; not on an AMD EPYC with AVX512-BF16, nor on every AMX machine). Where it
    reproduces, the workaround must be what makes the gradients finite. The day it reproduces nowhere, torch has
    fixed it and the workaround can go."""
    import model.attention as attention_module
    from training.runtime.cpu import cpu_class
    monkeypatch.setattr(attention_module, "_sdpa_outside_compile", F.scaled_dot_product_attention)
    if _compiled_bf16_grads_finite("sdpa"):
        pytest.skip(f"inductor's NaN-gradient bug does not reproduce on this CPU ({cpu_class().model}; "
                    f"{cpu_class().describe()}, torch {torch.__version__}): nothing for the workaround to avoid here")
    monkeypatch.undo()
    assert _compiled_bf16_grads_finite("sdpa")


@pytest.mark.parametrize("n_heads, n_kv_heads, past, scale", [(4, 4, 0, None), (4, 2, 0, None), (4, 1, 0, 0.3),
                                                              (4, 2, 5, None), (2, 2, 7, 0.1)])
def test_matmul_attention_is_sdpas_function(n_heads, n_kv_heads, past, scale):
    """In float64: MHA, GQA, MQA, an explicit scale (μP's), and T new queries after `past` cached keys
    (bottom-right aligned, every cached key visible), as the SDPA call in Attention.forward computes them."""
    from model.attention import _causal_mask, matmul_attention
    gen = torch.Generator().manual_seed(0)
    T, hd = 6, 8
    q = torch.randn(2, n_heads, T, hd, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(2, n_kv_heads, past + T, hd, generator=gen, dtype=torch.float64) for _ in range(2))
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=_causal_mask(T, past, q.device), is_causal=past == 0,
                                              enable_gqa=n_kv_heads != n_heads, scale=scale)
    torch.testing.assert_close(matmul_attention(q, k, v, scale), expected, rtol=1e-12, atol=1e-12)


def test_matmul_attention_dropout_drops_weights_and_keeps_their_expectation():
    """Uniform weights over 64 keys and v = 1: without dropout every output is 1; with p = 0.5 each weight is 0 or
    doubled, so outputs scatter around 1 (inverted dropout keeps the mean) and some keys are dropped."""
    from model.attention import matmul_attention
    torch.manual_seed(0)
    q, k = torch.zeros(1, 1, 64, 4), torch.zeros(1, 1, 64, 4)
    v = torch.ones(1, 1, 64, 4)
    torch.testing.assert_close(matmul_attention(q, k, v, None), v)
    dropped = matmul_attention(q, k, v, None, dropout_p=0.5)[0, 0, 32:, 0]  # rows that see >= 33 keys
    assert dropped.std() > 0.05 and abs(float(dropped.mean()) - 1) < 0.15


@pytest.mark.parametrize("kernel, device, dtype, T, past, dropout, compiling, finite_here, expected", [
    ("auto", "cpu", torch.bfloat16, 256, 0, 0.0, True, True, "hybrid"),
    ("auto", "cpu", torch.bfloat16, 1024, 0, 0.0, True, False, "hybrid"),  # longer, AMX tiles too
    ("auto", "cpu", torch.bfloat16, 8193, 0, 0.0, True, True, "sdpa"),  # > 2^26 scores: flash's backward holds none
    ("auto", "cpu", torch.bfloat16, 256, 0, 0.1, True, True, "matmul"),  # dropout: inside the graph
    ("auto", "cpu", torch.bfloat16, 257, 0, 0.1, True, True, "sdpa"),
    ("auto", "cpu", torch.bfloat16, 256, 0, 0.1, True, False, "sdpa"),  # a CPU with AMX tiles (inductor's NaN)
    ("auto", "cpu", torch.bfloat16, 4, 8, 0.0, True, True, "matmul"),  # after a cache: not hybrid's
    ("auto", "cpu", torch.float32, 256, 0, 0.0, True, True, "sdpa"), ("auto", "cpu", torch.bfloat16, 256, 0, 0.0, False, True, "sdpa"),
    ("auto", "meta", torch.bfloat16, 256, 0, 0.0, True, True, "sdpa"),  # any other device (a GPU): SDPA
    ("matmul", "cpu", torch.bfloat16, 256, 0, 0.0, True, False, "matmul"),  # asked for by name: as asked, even there
    ("matmul", "meta", torch.float32, 4096, 0, 0.0, False, True, "matmul"),
    ("sdpa", "cpu", torch.bfloat16, 256, 0, 0.0, True, True, "sdpa"),
    ("hybrid", "cpu", torch.float32, 256, 0, 0.0, False, True, "hybrid"),  # by name: eager and fp32 too
    ("hybrid", "cpu", torch.bfloat16, 4, 8, 0.0, True, True, "sdpa"),  # where it cannot run: SDPA, the same function
    ("hybrid", "cpu", torch.bfloat16, 256, 0, 0.1, True, True, "sdpa"), ("hybrid", "meta", torch.bfloat16, 256, 0, 0.0, True, True, "sdpa")])
def test_which_attention_kernel_runs(kernel, device, dtype, T, past, dropout, compiling, finite_here, expected,
                                     monkeypatch):
    """auto, while compiling a bf16 CPU model: hybrid without a cache or dropout up to 2^26 scores; matmul with dropout over <= 256
    keys where that compiles to finite gradients (not a CPU with AMX tiles); SDPA otherwise. An explicit choice is
    used as named, hybrid only where it can run. Every CPU class is faked here."""
    import model.attention as attention_module
    from model.attention import kernel_for
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling)
    monkeypatch.setattr(attention_module, "compiled_matmul_attention_is_finite_here", lambda: finite_here)
    q = torch.empty(1, 1, T, 8, dtype=dtype, device=device)
    assert kernel_for(kernel, q, past, dropout) == expected


def test_unknown_attention_kernel_names_the_choices():
    with pytest.raises(ValueError, match=r"model.attention_kernel='flash' is unknown; choose one of \['auto', 'sdpa', 'matmul', 'hybrid'\]"):
        ModelConfig(attention_kernel="flash")


def test_matmul_attention_forced_where_it_compiles_to_nan_is_warned_at_the_start(monkeypatch):
    """Forcing model.attention_kernel=matmul on a CPU with inductor's AMX fault (faked, so every class checks it) gets
    one warning line naming the fix before training; auto, sdpa, fp32, no compile or another CPU get none."""
    import model.attention as attention_module
    from cli.config import compose_train_config
    from training.build import matmul_attention_warning
    cpu = torch.device("cpu")
    forced, _ = compose_train_config(["model.attention_kernel=matmul", "trainer.compile=auto"])
    monkeypatch.setattr(attention_module, "compiled_matmul_attention_is_finite_here", lambda: False)
    line = matmul_attention_warning(forced, cpu, "bf16")
    assert line.startswith("warning: model.attention_kernel=matmul, compiled in bf16 on this CPU (AMX tiles), gives NaN")
    assert line.endswith("use model.attention_kernel=auto or sdpa") and "\n" not in line
    auto, _ = compose_train_config(["trainer.compile=auto"])
    uncompiled, _ = compose_train_config(["model.attention_kernel=matmul", "trainer.compile=false"])
    assert matmul_attention_warning(auto, cpu, "bf16") is None and matmul_attention_warning(forced, cpu, "fp32") is None
    assert matmul_attention_warning(uncompiled, cpu, "bf16") is None
    assert matmul_attention_warning(forced, torch.device("meta"), "bf16") is None  # a GPU: SDPA's kernels
    monkeypatch.setattr(attention_module, "compiled_matmul_attention_is_finite_here", lambda: True)
    assert matmul_attention_warning(forced, cpu, "bf16") is None
