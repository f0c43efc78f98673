"""Same weights into Hugging Face's Llama modules give the same outputs: the proof that the math is LLaMA's
(and, with qk_norm, Qwen3's), padded vocabulary included."""

import pytest
import torch
from model_helpers import one_thread, random_transformer, tiny_model_config

from model import RMSNorm, SwiGLU, Transformer

transformers = pytest.importorskip("transformers", reason="parity tests need `transformers` (requirements-dev.txt)")
modeling_llama = pytest.importorskip("transformers.models.llama.modeling_llama")
LlamaConfig, LlamaForCausalLM = transformers.LlamaConfig, transformers.LlamaForCausalLM
Qwen3Config, Qwen3ForCausalLM = transformers.Qwen3Config, transformers.Qwen3ForCausalLM
LlamaMLP, LlamaRMSNorm = modeling_llama.LlamaMLP, modeling_llama.LlamaRMSNorm

TOL = dict(rtol=0, atol=1e-4)


def hf_config(model: Transformer, config_cls=LlamaConfig):
    cfg = model.cfg
    return config_cls(  # HF's vocab_size is the embedding's row count: the padded one
        vocab_size=cfg.padded_vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.resolved_intermediate_size,
        num_hidden_layers=cfg.n_layers,
        num_attention_heads=cfg.n_heads,
        num_key_value_heads=cfg.resolved_n_kv_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_seq_len,
        rms_norm_eps=cfg.norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        tie_word_embeddings=cfg.tie_embeddings,
        attention_bias=False,
        **({"mlp_bias": False} if config_cls is LlamaConfig else {"use_sliding_window": False}),
    )


def to_hf_state_dict(model: Transformer) -> dict:
    """Our names → HF's. Written here, not imported from interop/, so the test checks the math on its own."""
    renames = {"attn_norm": "input_layernorm", "mlp_norm": "post_attention_layernorm", "attn": "self_attn"}
    out = {}
    for name, tensor in model.state_dict().items():
        if name == "lm_head.weight":
            out[name] = tensor
            continue
        parts = [renames.get(p, p) for p in name.split(".")]
        hf_name = "model." + ".".join(parts)
        if "gate_up_proj" in hf_name:
            gate, up = tensor.chunk(2, dim=0)  # first half of the fused rows is the gate
            out[hf_name.replace("gate_up_proj", "gate_proj")] = gate
            out[hf_name.replace("gate_up_proj", "up_proj")] = up
        else:
            out[hf_name] = tensor
    return out


def test_rmsnorm_matches_llama_rmsnorm():
    torch.manual_seed(0)
    ours, theirs = RMSNorm(48, eps=1e-6), LlamaRMSNorm(48, eps=1e-6)
    with torch.no_grad():
        ours.weight.copy_(torch.randn(48))
        theirs.weight.copy_(ours.weight)
    x = 4 * torch.randn(3, 7, 48)
    torch.testing.assert_close(ours(x), theirs(x), **TOL)
    # bf16 activations with an fp32 weight (the autocast case): same dtype out, same bits.
    x16 = x.bfloat16()
    assert ours(x16).dtype == theirs(x16).dtype
    assert torch.equal(ours(x16), theirs(x16))


def test_swiglu_matches_llama_mlp():
    torch.manual_seed(0)
    ours = SwiGLU(48, 128)
    theirs = LlamaMLP(
        LlamaConfig(hidden_size=48, intermediate_size=128, num_attention_heads=4, hidden_act="silu", mlp_bias=False)
    )
    gate, up = ours.gate_up_proj.weight.detach().chunk(2, dim=0)
    theirs.load_state_dict(
        {"gate_proj.weight": gate, "up_proj.weight": up, "down_proj.weight": ours.down_proj.weight.detach()}
    )
    x = torch.randn(3, 7, 48)
    torch.testing.assert_close(ours(x), theirs(x), **TOL)


@pytest.mark.parametrize(
    "overrides",
    [
        {"n_kv_heads": None},  # MHA: 4 query heads, 4 kv heads (enable_gqa off); tied embeddings, multiple_of 16
        {},  # GQA: 4 query heads sharing 2 kv heads (tiny_model_config's default)
        # MQA, untied head, non-default width rule, theta and eps
        {
            "n_kv_heads": 1,
            "multiple_of": 48,
            "ffn_dim_multiplier": 1.3,
            "tie_embeddings": False,
            "rope_theta": 5e5,
            "norm_eps": 1e-6,
        },
    ],
    ids=["mha-tied", "gqa-tied", "mqa-untied-multiple48"],
)
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_whole_model_matches_llama_for_causal_lm(overrides, attn_implementation):
    model = random_transformer(tiny_model_config(**overrides))
    hf = LlamaForCausalLM._from_config(hf_config(model), attn_implementation=attn_implementation).eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected
    assert missing in ([], ["lm_head.weight"])  # a tied head is the embedding: nothing to load
    assert torch.equal(hf.lm_head.weight, model.lm_head.weight)
    torch.manual_seed(3)
    ids = torch.randint(0, model.cfg.vocab_size, (2, model.cfg.max_seq_len))
    with one_thread(), torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids, use_cache=False).logits, **TOL)


def test_qk_norm_model_matches_qwen3_for_causal_lm():
    """QK-norm as Qwen3 has it: RMSNorm over head_dim on q and k, before RoPE. The norm weights are
    perturbed (random_transformer), so a norm applied after RoPE or on the wrong tensor would show."""
    model = random_transformer(tiny_model_config(qk_norm=True, n_kv_heads=2, rope_theta=5e5, norm_eps=1e-6))
    hf = Qwen3ForCausalLM._from_config(hf_config(model, Qwen3Config), attn_implementation="eager").eval()
    missing, unexpected = hf.load_state_dict(to_hf_state_dict(model), strict=False)
    assert not unexpected and missing in ([], ["lm_head.weight"])
    assert any("q_norm" in name for name in to_hf_state_dict(model))
    ids = torch.randint(0, model.cfg.vocab_size, (2, model.cfg.max_seq_len), generator=torch.Generator().manual_seed(3))
    with one_thread(), torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids, use_cache=False).logits, **TOL)
