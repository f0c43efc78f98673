"""The full model: every variant trains; init scales every layer that writes into the residual stream
(found by tracing, whatever its name); hidden_states; tying, padding, parameter accounting.
FLOPs: tests/test_flops.py."""
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from model import MLPS, NORMS, ModelConfig, Transformer
from model_helpers import one_thread, random_transformer, reference_forward, tiny_model_config

# Every variant once: each norm with SwiGLU, each MLP with RMSNorm, and QK-norm (modules are independent).
VARIANTS = [{"norm": n} for n in NORMS] + [{"mlp": m} for m in MLPS if m != "swiglu"] + [{"qk_norm": True}]


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(f"{k}={v}" for k, v in v.items()))
def test_variant_trains_under_bf16_autocast_and_overfits_one_batch(variant):
    cfg = tiny_model_config(max_seq_len=16, **variant)
    torch.manual_seed(0)
    model = Transformer(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.randint(0, cfg.vocab_size, (2, 17))
    inputs, targets = batch[:, :-1], batch[:, 1:]
    losses = []
    with one_thread():
        for step in range(50):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(inputs)
            assert logits.shape == (2, 16, cfg.padded_vocab_size) and logits.dtype == torch.bfloat16
            loss = F.cross_entropy(logits.float().reshape(-1, cfg.padded_vocab_size), targets.reshape(-1))
            loss.backward()
            if step == 0:
                for name, p in model.named_parameters():
                    assert p.grad is not None and torch.isfinite(p.grad).all(), name
                    assert p.grad.abs().sum() > 0, f"{name} gets no gradient"
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    assert math.isclose(losses[0], math.log(cfg.padded_vocab_size), rel_tol=0.1)  # a fresh model guesses uniformly
    # Without norms the stream keeps its init scale (std 0.02), logits start near zero and learning
    # is slower at this shared LR (higher ones diverge): it must learn, not memorise, in 50 steps.
    target = 2.0 if variant.get("norm") == "none" else 0.2
    assert losses[-1] < target, f"{variant} did not memorise 32 tokens: {losses[0]:.2f} → {losses[-1]:.2f}"


def test_forward_returns_padded_logits_and_rejects_too_long_input():
    cfg = tiny_model_config()  # vocab 61 → 64 rows
    model = Transformer(cfg)
    out = model(torch.zeros(3, 5, dtype=torch.long))
    assert isinstance(out, torch.Tensor) and out.shape == (3, 5, 64) and cfg.padded_vocab_size == 64
    assert model.embed_tokens.weight.shape == (64, cfg.hidden_size)
    too_long = (f"sequence of {cfg.max_seq_len + 1} tokens exceeds model.max_seq_len={cfg.max_seq_len}; "
                "shorten the input or train with a larger max_seq_len")
    with pytest.raises(ValueError) as raised:
        model(torch.zeros(1, cfg.max_seq_len + 1, dtype=torch.long))
    assert str(raised.value) == too_long
    cache = model.new_kv_cache(1)  # with a cache, the count includes what it holds
    model(torch.zeros(1, 3, dtype=torch.long), cache)
    with pytest.raises(ValueError, match=f"sequence of {cfg.max_seq_len + 1} tokens"):
        model(torch.zeros(1, cfg.max_seq_len - 2, dtype=torch.long), cache)


@pytest.mark.parametrize("mlp", sorted(MLPS))
def test_dropout_reaches_every_part_that_drops(mlp):
    """model.dropout is the rate of the attention, residual and MLP dropouts alike."""
    model = Transformer(tiny_model_config(dropout=0.3, mlp=mlp))
    rates = {name: m.p for name, m in model.named_modules() if isinstance(m, nn.Dropout)}
    assert any(".mlp." in n for n in rates) and set(rates.values()) == {0.3}, rates
    assert all(block.attn.dropout == 0.3 for block in model.layers)


def test_forward_is_the_lm_head_of_the_final_normed_hidden_states():
    model = random_transformer(tiny_model_config())
    ids = torch.randint(0, 61, (2, 9), generator=torch.Generator().manual_seed(0))
    normed = []
    model.norm.register_forward_hook(lambda module, args, out: normed.append(out))
    hidden = model.hidden_states(ids)
    assert hidden.shape == (2, 9, model.cfg.hidden_size) and torch.equal(hidden, normed[-1])
    assert torch.equal(model(ids), model.lm_head(hidden))
    # With a cache, positions continue after it: two calls give the one-call states.
    cache = model.new_kv_cache(2)
    pieces = torch.cat([model.hidden_states(ids[:, :4], cache), model.hidden_states(ids[:, 4:], cache)], dim=1)
    torch.testing.assert_close(pieces, hidden, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("overrides", [
    {"norm_eps": 0.05, "rope_theta": 37.0},  # GQA; both far from their defaults, so each must reach the math
    {"n_kv_heads": None, "tie_embeddings": False, "norm_eps": 1e-6, "rope_theta": 5e5},  # MHA, untied
], ids=["gqa-eps-theta", "mha-untied"])
def test_forward_matches_the_float64_reference_built_from_the_config(overrides):
    """Embedding → pre-norm blocks → final norm → head, against the whole recipe in float64 with
    model.norm_eps and model.rope_theta taken from the config (model_helpers.reference_forward)."""
    model = random_transformer(tiny_model_config(**overrides))
    ids = torch.randint(0, model.cfg.vocab_size, (2, model.cfg.max_seq_len), generator=torch.Generator().manual_seed(1))
    with one_thread(), torch.no_grad():
        logits = model(ids).double()
        torch.testing.assert_close(logits, reference_forward(model, ids), rtol=0, atol=2e-5)
        # The constants matter at this tolerance: the defaults give other logits.
        default = Transformer(tiny_model_config(**{**overrides, "norm_eps": 1e-5, "rope_theta": 1e4})).eval()
        default.load_state_dict(model.state_dict())
        assert (default(ids).double() - logits).abs().max() > 1e-3


def test_tied_embeddings_share_storage():
    tied = Transformer(tiny_model_config(tie_embeddings=True))
    assert tied.lm_head.weight is tied.embed_tokens.weight
    with torch.no_grad():
        tied.embed_tokens.weight[3, 0] = 123.0
    assert tied.lm_head.weight[3, 0] == 123.0
    untied = Transformer(tiny_model_config(tie_embeddings=False))
    assert untied.lm_head.weight.data_ptr() != untied.embed_tokens.weight.data_ptr()


# ---- init: the property, checked on the autograd graph ------------------------------------------

def residual_writers(model: Transformer, ids: torch.Tensor) -> set:
    """Names of the Linear layers whose output is added into the residual stream, read off autograd.

    The stream is a chain of additions from the embedding to the final norm: walk back from the
    final norm's input through additions only, and collect every addend a Linear produced.
    """
    producer, stream = {}, []
    hooks = [module.register_forward_hook(lambda m, args, out, name=name: producer.__setitem__(out.grad_fn, name))
             for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    hooks.append(model.norm.register_forward_pre_hook(lambda m, args: stream.append(args[0])))
    try:
        with torch.enable_grad():
            model(ids)
    finally:
        for hook in hooks:
            hook.remove()
    writers, seen, todo = set(), set(), [stream[0].grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in producer:
            writers.add(producer[node])
        elif node.name().startswith("AddBackward"):
            todo.extend(fn for fn, _ in node.next_functions)
    return writers


def check_init(model: Transformer, writers: set) -> None:
    """Residual writers at init_std/sqrt(2·n_layers), every other matrix at init_std, norms at identity."""
    cfg = model.cfg
    out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Embedding)):
            w, expected = module.weight, out_std if name in writers else cfg.init_std
            assert w.std().item() == pytest.approx(expected, rel=0.05), name  # ≥ 16k samples: ~0.6 % noise
            assert abs(w.mean().item()) < 0.05 * expected, name
    for name, p in model.named_parameters():
        if p.dim() == 1:
            assert torch.equal(p, torch.zeros_like(p) if name.endswith("bias") else torch.ones_like(p)), name


class BilinearMLP(nn.Module):
    """A test-only MLP written as docs/architecture.md says, with its own layer names."""

    gated = True

    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float = 0.0):
        super().__init__()
        self.w_in = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w_gate = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w_out = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(self.w_in(x) * self.w_gate(x))

    def init_weights(self, std: float, out_std: float) -> None:
        nn.init.normal_(self.w_in.weight, std=std)
        nn.init.normal_(self.w_gate.weight, std=std)
        nn.init.normal_(self.w_out.weight, std=out_std)


class ForgetfulMLP(BilinearMLP):
    """The bug the old name-based rule let through: the output layer keeps the plain std."""

    def init_weights(self, std: float, out_std: float) -> None:
        for layer in (self.w_in, self.w_gate, self.w_out):
            nn.init.normal_(layer.weight, std=std)


class NoInitMLP(BilinearMLP):
    init_weights = None  # as if never written


def init_test_model(**overrides) -> Transformer:
    cfg = ModelConfig(vocab_size=512, hidden_size=128, n_layers=8, n_heads=4, max_seq_len=8, init_std=0.05,
                      **overrides)
    torch.manual_seed(0)
    with one_thread():
        return Transformer(cfg).eval()


@pytest.mark.parametrize("mlp", [*MLPS, "test_bilinear"])
def test_every_linear_writing_into_the_residual_stream_is_depth_scaled(mlp, monkeypatch):
    monkeypatch.setitem(MLPS, "test_bilinear", BilinearMLP)
    # Tied for SwiGLU, untied for the others: the untied head has its own init_std draw.
    model = init_test_model(mlp=mlp, qk_norm=True, norm="layernorm", tie_embeddings=mlp == "swiglu")
    writers = residual_writers(model, torch.arange(8)[None])
    for i in range(model.cfg.n_layers):  # each block writes twice: attention and MLP
        assert any(w.startswith(f"layers.{i}.attn.") for w in writers), writers
        assert any(w.startswith(f"layers.{i}.mlp.") for w in writers), writers
    assert "lm_head" not in writers
    check_init(model, writers)


def test_the_property_check_catches_an_mlp_that_forgets_its_output_layer(monkeypatch):
    monkeypatch.setitem(MLPS, "forgetful", ForgetfulMLP)
    model = init_test_model(mlp="forgetful")
    writers = residual_writers(model, torch.arange(8)[None])
    assert {f"layers.{i}.mlp.w_out" for i in range(8)} <= writers  # found by tracing, not by its name
    with pytest.raises(AssertionError, match="mlp.w_out"):
        check_init(model, writers)


def test_a_block_part_without_init_weights_is_refused(monkeypatch):
    monkeypatch.setitem(MLPS, "no_init", NoInitMLP)
    with pytest.raises(TypeError) as raised:
        init_test_model(mlp="no_init")
    assert str(raised.value) == ("NoInitMLP (block part 'mlp') has parameters but no init_weights(std, out_std); "
                                 "add one (docs/architecture.md, 'add an MLP')")


@pytest.mark.parametrize("overrides", [{}, {"tie_embeddings": False, "norm": "layernorm", "mlp": "gelu",
                                            "qk_norm": True, "vocab_size": 300}])
def test_meta_device_init_then_to_empty_matches_a_normal_build(overrides):
    """Large-model init: shapes on `meta`, memory with to_empty(), values from init_weights() alone."""
    cfg = ModelConfig(**{**dict(vocab_size=512, hidden_size=128, n_layers=4, n_heads=4, max_seq_len=16,
                                init_std=0.05), **overrides})
    with torch.device("meta"):
        lazy = Transformer(cfg)
    lazy = lazy.to_empty(device="cpu")
    with torch.no_grad():  # whatever to_empty's memory held: a parameter init_weights misses stays at 7
        for p in lazy.parameters():
            p.fill_(7.0)
        lazy.rope_cos.fill_(7.0)
    with one_thread():
        lazy.init_weights()
        eager = Transformer(cfg)
    assert torch.equal(lazy.rope_cos, eager.rope_cos) and torch.equal(lazy.rope_sin, eager.rope_sin)
    assert (lazy.lm_head.weight is lazy.embed_tokens.weight) == cfg.tie_embeddings
    eager_params = dict(eager.named_parameters())
    assert eager_params.keys() == dict(lazy.named_parameters()).keys()
    for name, p in lazy.named_parameters():
        q = eager_params[name]
        if q.dim() == 1:  # norm weights and biases: exact
            assert torch.equal(p, q), name
        else:
            assert p.std().item() == pytest.approx(q.std().item(), rel=0.05), name
            assert abs(p.mean().item()) < 0.05 * q.std().item(), name


# ---- accounting ---------------------------------------------------------------------------------

def expected_counts(cfg: ModelConfig) -> dict:
    d, hd, L = cfg.hidden_size, cfg.head_dim, cfg.n_layers
    gated = cfg.mlp in ("swiglu", "geglu")
    per_norm = {"rmsnorm": d, "rmsnorm_bf16": d, "layernorm": 2 * d, "none": 0}[cfg.norm]
    return {
        "embedding": cfg.padded_vocab_size * d,
        "attention": L * (2 * d * cfg.n_heads * hd + 2 * d * cfg.resolved_n_kv_heads * hd),  # q, o; k, v
        "mlp": L * (3 if gated else 2) * d * cfg.resolved_intermediate_size,
        "norm": (2 * L + 1) * per_norm + (L * 2 * hd if cfg.qk_norm else 0),  # QK-norm counts as norm
        "lm_head": 0 if cfg.tie_embeddings else cfg.padded_vocab_size * d,
    }


@pytest.mark.parametrize("overrides", [
    {}, {"tie_embeddings": False}, {"norm": "layernorm", "mlp": "gelu"}, {"mlp": "geglu", "n_kv_heads": 1},
    {"norm": "none"}, {"norm": "rmsnorm_bf16", "qk_norm": True}, {"norm": "none", "qk_norm": True},
])
def test_param_counts_match_formulas_and_add_up(overrides):
    model = Transformer(tiny_model_config(**overrides))
    counts = model.param_counts()
    assert counts == {**expected_counts(model.cfg), "total": counts["total"]}
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_param_count_of_llama_7b():
    # Meta's published 7B shape must come to its well-known 6,738,415,616 parameters (32000 = 500·64: no padding).
    cfg = ModelConfig(vocab_size=32000, hidden_size=4096, n_layers=32, n_heads=32, multiple_of=256,
                      max_seq_len=2048, norm_eps=1e-6, tie_embeddings=False)
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = Transformer(cfg)
    assert model.param_counts()["total"] == 6_738_415_616

