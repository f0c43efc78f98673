"""model/attention.py: attention against a hand-written float64 reference (with and without QK-norm); GQA equals
MHA with repeated kv heads; causality; QK-norm's scale invariance; dropout and inductor's NaN workaround. RoPE: the
tables against the formula, rotate-half pairing, norm preservation, relative positions (also through the attention
module: q and k both rotated). The KV cache: decoding equals full recompute (token by token and in chunks); sizes,
reset and overflow."""

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from model_helpers import one_thread, random_transformer, reference_attention, tiny_model_config

from model import KVCache, ModelConfig, Transformer, apply_rope, rope_tables
from model.attention import Attention

REPO = Path(__file__).resolve().parents[1]


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
    torch.testing.assert_close(
        attn(x, cos, sin).double(), reference_attention(attn, x, cos, sin, cfg.norm_eps), rtol=1e-5, atol=1e-5
    )


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
            torch.testing.assert_close(
                logits[:, :t], base[:, :t], rtol=0, atol=1e-6, msg=f"changing token {t} moved an earlier logit"
            )
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


def _compiled_bf16_grads_finite(dropout: float = 0.1, workaround: bool = True) -> bool:
    """Train one step of a compiled 1-layer model with attention dropout under bf16 autocast on the CPU (its SDPA
    compiled into the graph if not `workaround`)."""
    torch.manual_seed(0)
    torch._dynamo.reset()
    try:
        cfg = ModelConfig(
            vocab_size=256, hidden_size=64, n_layers=1, n_heads=1, dropout=dropout, max_seq_len=64, multiple_of=32
        )
        model = Transformer(cfg).train()
        if not workaround:
            for layer in model.layers:
                layer.attn.sdpa_with_dropout = F.scaled_dot_product_attention
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
    for name, model in (
        ("train", Transformer(cfg).train()),
        ("eval", Transformer(cfg).eval()),
        ("no dropout", Transformer(replace(cfg, dropout=0.0)).train()),
    ):
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
    cfg = ModelConfig(
        vocab_size=256, hidden_size=64, n_layers=2, n_heads=1, dropout=0.1, max_seq_len=64, multiple_of=32
    )
    breaks = _graph_breaks(cfg)
    assert len(breaks["train"]) == cfg.n_layers and all("_sdpa_outside_compile" in r for r in breaks["train"])
    assert breaks["eval"] == breaks["no dropout"] == []
    assert _compiled_bf16_grads_finite()


def test_only_a_model_with_dropout_imports_dynamo():
    """The workaround's torch.compiler.disable imports torch._dynamo (~2 s); train.py's imports and a model without
    dropout never need it, so train.py's refusals and the programs that build a model start without it."""
    code = (
        "import runpy, sys; runpy.run_path('train.py'); from model import ModelConfig, Transformer; "
        "cfg = dict(vocab_size=64, hidden_size=32, n_layers=1, n_heads=1, multiple_of=32); "
        "Transformer(ModelConfig(**cfg)); print('torch._dynamo' in sys.modules); "
        "Transformer(ModelConfig(**cfg, dropout=0.1)); print('torch._dynamo' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]


def test_the_default_attention_trains_finite_compiled_in_bf16_on_this_cpu_whatever_its_class():
    """What a user's compiled bf16 run gets from the default model (SDPA, dropout 0) on the machine the suite runs on:
    finite gradients. (With dropout, SDPA's eager workaround above is what runs there.)"""
    assert _compiled_bf16_grads_finite(dropout=0.0)


def test_the_bug_the_workaround_avoids_where_it_reproduces():
    """torch 2.13's inductor on some CPUs turns SDPA's backward with dropout under bf16 autocast into NaN gradients
    for q and k (seen on an AMX Xeon; not on an AMD EPYC with AVX512-BF16, nor on every AMX machine). Where it
    reproduces, the workaround must be what makes the gradients finite. The day it reproduces nowhere, torch has
    fixed it and the workaround can go."""
    import platform

    from training.distributed import cpu_bf16

    if _compiled_bf16_grads_finite(workaround=False):
        pytest.skip(
            f"inductor's NaN-gradient bug does not reproduce on this CPU ({platform.processor() or platform.machine()}; "
            f"{cpu_bf16()[1]}, torch {torch.__version__}): nothing for the workaround to avoid here"
        )
    assert _compiled_bf16_grads_finite()


# ---- RoPE ----------------------------------------------------------------------------------------------------


def test_tables_match_formula():
    head_dim, theta = 8, 500.0
    cos, sin = rope_tables(head_dim, 40, theta)
    assert cos.shape == sin.shape == (40, head_dim) and cos.dtype == torch.float32
    for t in (0, 1, 7, 39):
        for i in range(head_dim):
            angle = t * theta ** (-2 * (i % (head_dim // 2)) / head_dim)  # frequencies repeat: rotate-half
            assert math.isclose(cos[t, i].item(), math.cos(angle), abs_tol=1e-6)
            assert math.isclose(sin[t, i].item(), math.sin(angle), abs_tol=1e-6)


def test_tables_are_exact_to_fp32_rounding_at_long_positions():
    """Position × frequency reaches ~8k rad at the end of an 8k context: the angles must be computed in
    float64 (fp32 frequencies alone would put ~5e-4 rad of error into the last positions)."""
    head_dim, positions = 64, torch.tensor([1000, 4095, 8191])
    cos, sin = rope_tables(head_dim, 8192, 10000.0)
    inv_freq = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[:, None].double() * torch.cat([inv_freq, inv_freq])
    assert (cos[positions].double() - angles.cos()).abs().max() < 1e-7
    assert (sin[positions].double() - angles.sin()).abs().max() < 1e-7


def test_default_theta_is_llamas_10000():
    assert all(torch.equal(a, b) for a, b in zip(rope_tables(16, 32), rope_tables(16, 32, 10000.0)))
    assert not torch.equal(rope_tables(16, 32)[0], rope_tables(16, 32, 10001.0)[0])


def test_position_zero_is_identity():
    cos, sin = rope_tables(16, 4)
    x = torch.randn(2, 1, 3, 16)
    torch.testing.assert_close(apply_rope(x, cos[:1], sin[:1]), x)


def test_dimension_i_pairs_with_i_plus_half():
    # HF's rotate-half layout (not interleaved pairs 2i, 2i+1): the exported weights need no permutation.
    head_dim = 8
    cos, sin = rope_tables(head_dim, 2, theta=1.0)  # theta 1: every pair turns by 1 rad per position
    x = torch.zeros(1, 1, 1, head_dim)
    x[..., 1] = 1.0
    out = apply_rope(x, cos[1:2], sin[1:2])[0, 0, 0]
    expected = torch.zeros(head_dim)
    expected[1], expected[1 + head_dim // 2] = math.cos(1.0), math.sin(1.0)
    torch.testing.assert_close(out, expected)


def test_rope_preserves_vector_norms():
    torch.manual_seed(0)
    cos, sin = rope_tables(32, 64)
    x = torch.randn(2, 64, 4, 32)
    torch.testing.assert_close(apply_rope(x, cos, sin).norm(dim=-1), x.norm(dim=-1))


def test_scores_depend_only_on_relative_position():
    torch.manual_seed(0)
    head_dim = 16
    cos, sin = rope_tables(head_dim, 64)
    q, k = torch.randn(head_dim), torch.randn(head_dim)

    def score(m: int, n: int) -> float:
        q_m = apply_rope(q.view(1, 1, 1, -1), cos[m : m + 1], sin[m : m + 1])
        k_n = apply_rope(k.view(1, 1, 1, -1), cos[n : n + 1], sin[n : n + 1])
        return (q_m * k_n).sum().item()

    for m, n in ((5, 2), (9, 9), (3, 11)):
        for shift in (1, 17, 40):
            assert math.isclose(score(m, n), score(m + shift, n + shift), rel_tol=1e-4, abs_tol=1e-5)
    assert not math.isclose(score(5, 2), score(5, 3), rel_tol=1e-3)  # and it does depend on m - n


def test_bf16_input_stays_bf16():
    cos, sin = rope_tables(8, 4)
    out = apply_rope(torch.randn(1, 4, 2, 8, dtype=torch.bfloat16), cos, sin)
    assert out.dtype == torch.bfloat16


def attention_at(attn, x, start: int, cos, sin):
    """The attention module's output for x placed at positions start .. start + T - 1."""
    T = x.shape[1]
    return attn(x, cos[start : start + T], sin[start : start + T])


def test_attention_sees_relative_positions_only():
    """RoPE on both q and k: shifting every position by the same amount changes no output. Rotating
    only one of them (or the two by different tables) leaves absolute positions in the scores."""
    torch.manual_seed(0)
    cfg = tiny_model_config(max_seq_len=64)
    attn = Attention(cfg, layer_idx=0).eval()
    with torch.no_grad():  # scores far from uniform, so the positions in them show in the output
        attn.q_proj.weight.normal_(0.0, 0.3)
        attn.k_proj.weight.normal_(0.0, 0.3)
    cos, sin = rope_tables(cfg.head_dim, 64)
    x = torch.randn(2, 10, cfg.hidden_size)
    with torch.no_grad():
        at_zero = attention_at(attn, x, 0, cos, sin)
        for start in (1, 13, 54):
            torch.testing.assert_close(attention_at(attn, x, start, cos, sin), at_zero, rtol=1e-4, atol=1e-5)
        # ... and the rotation is really applied: without it (cos 1, sin 0) the output differs.
        unrotated = attn(x, torch.ones(10, cfg.head_dim), torch.zeros(10, cfg.head_dim))
        assert (unrotated - at_zero).abs().max() > 1e-3


# ---- the KV cache ---------------------------------------------------------------------------------------------

CFG = tiny_model_config()  # n_heads 4, n_kv_heads 2: the cache path must handle GQA


def full_and_incremental(chunks: list) -> tuple:
    """Logits for the whole sequence in one pass, and fed through a cache in `chunks` pieces."""
    model = random_transformer(CFG)
    torch.manual_seed(2)
    ids = torch.randint(0, CFG.vocab_size, (2, sum(chunks)))
    with one_thread(), torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(batch_size=2)
        pieces, start = [], 0
        for n in chunks:
            pieces.append(model(ids[:, start : start + n], cache=cache))
            start += n
            assert cache.length == start
    return full, torch.cat(pieces, dim=1)


def test_prefill_then_one_token_at_a_time_equals_full_forward():
    full, incremental = full_and_incremental([6] + [1] * 10)
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-5)


def test_chunked_prefill_after_a_cache_equals_full_forward():
    # T > 1 new tokens after cached ones is where a top-left causal mask would hide the cache.
    full, incremental = full_and_incremental([5, 4, 1, 2, 7, 1, 3])
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-5)


def test_cache_is_sized_for_kv_heads_and_model_dtype():
    model = random_transformer(CFG)
    cache = model.new_kv_cache(batch_size=3, max_seq_len=10)
    assert isinstance(cache, KVCache) and len(cache.keys) == len(cache.values) == CFG.n_layers
    assert cache.keys[0].shape == (3, CFG.resolved_n_kv_heads, 10, CFG.head_dim)
    assert cache.keys[0].dtype == torch.float32
    assert model.new_kv_cache(1).keys[0].shape[2] == CFG.max_seq_len
    assert model.new_kv_cache(1, dtype=torch.bfloat16).values[1].dtype == torch.bfloat16


def test_reset_reuses_the_cache():
    model = random_transformer(CFG)
    ids = torch.randint(0, CFG.vocab_size, (1, 8))
    with torch.no_grad():
        cache = model.new_kv_cache(1)
        first = model(ids, cache=cache)
        cache.reset()
        assert cache.length == 0
        torch.testing.assert_close(model(ids, cache=cache), first, rtol=0, atol=0)


def test_overflow_raises():
    model = random_transformer(CFG)
    ids = torch.randint(0, CFG.vocab_size, (1, 6))
    with torch.no_grad():
        cache = model.new_kv_cache(1, max_seq_len=8)
        model(ids, cache=cache)
        with pytest.raises(ValueError, match="KV cache overflow: 9 positions > max_seq_len=8"):
            model(ids[:, :3], cache=cache)
        model(ids[:, :2], cache=cache)  # exactly full is fine
        assert cache.length == 8
        # The model's own limit is checked before any layer writes.
        long_cache = model.new_kv_cache(1)
        model(torch.zeros(1, CFG.max_seq_len - 2, dtype=torch.long), cache=long_cache)
        with pytest.raises(ValueError, match="max_seq_len"):
            model(ids[:, :3], cache=long_cache)
        assert long_cache.length == CFG.max_seq_len - 2


def test_cache_and_masks_live_on_the_models_device():
    """Built on `meta` (any non-CPU device behaves alike): the cache, the chunked-decode mask and
    the forward pass stay there; a buffer made on the CPU would fail to meet a meta tensor."""
    with torch.device("meta"):
        model = Transformer(CFG)
    cache = model.new_kv_cache(2)
    assert {t.device.type for t in cache.keys + cache.values} == {"meta"}
    ids = torch.zeros(2, 4, dtype=torch.long, device="meta")
    model(ids, cache)
    assert model(ids[:, :3], cache).device.type == "meta"  # 3 new tokens after 4 cached: an explicit mask
    assert KVCache(1, 1, 4, 1, 2, device="meta").values[0].device.type == "meta"
    default = KVCache(1, 1, 4, 1, 2)
    assert default.keys[0].device.type == "cpu" and default.keys[0].dtype == torch.float32
