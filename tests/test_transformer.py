"""The full model: every variant trains; init scales every layer that writes into the residual stream
(found by tracing, whatever its name); hidden_states; tying, padding, parameter accounting; training FLOPs
per token (token_flops) against a hand count and against torch's FlopCounterMode; μP's model half: at the base
width mup is sp; the float64 reference with its attention scale and output multiplier; init that scales only the
blocks' matrices; every path to logits multiplied; a folded sp copy computes the same logits; FLOPs and parameter
counts unchanged. (μP's config fields and errors: tests/test_model_config.py.)"""

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
from model_helpers import one_thread, random_transformer, reference_forward, tiny_model_config
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from interop.hf_export import as_standard
from model import MLPS, NORMS, ModelConfig, Transformer
from model.generate import generate_ids
from training.loop import CausalLMLoss

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
    too_long = (
        f"sequence of {cfg.max_seq_len + 1} tokens exceeds model.max_seq_len={cfg.max_seq_len}; "
        "shorten the input or train with a larger max_seq_len"
    )
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


@pytest.mark.parametrize(
    "overrides",
    [
        {"norm_eps": 0.05, "rope_theta": 37.0},  # GQA; both far from their defaults, so each must reach the math
        {"n_kv_heads": None, "tie_embeddings": False, "norm_eps": 1e-6, "rope_theta": 5e5},  # MHA, untied
    ],
    ids=["gqa-eps-theta", "mha-untied"],
)
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
    hooks = [
        module.register_forward_hook(lambda m, args, out, name=name: producer.__setitem__(out.grad_fn, name))
        for name, module in model.named_modules()
        if isinstance(module, nn.Linear)
    ]
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


class NoInitMLP(nn.Module):
    """An MLP whose author never wrote init_weights."""

    gated = True

    def __init__(self, hidden_size: int, intermediate_size: int, dropout: float = 0.0):
        super().__init__()
        self.w_in = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.w_out = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w_out(self.w_in(x))


def init_test_model(**overrides) -> Transformer:
    cfg = ModelConfig(vocab_size=512, hidden_size=128, n_layers=8, n_heads=4, max_seq_len=8, init_std=0.05, **overrides)
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
    assert str(raised.value) == (
        "NoInitMLP (block part 'mlp') has parameters but no init_weights(std, out_std); "
        "add one (docs/architecture.md, 'add an MLP')"
    )


@pytest.mark.parametrize(
    "overrides", [{}, {"tie_embeddings": False, "norm": "layernorm", "mlp": "gelu", "qk_norm": True, "vocab_size": 300}]
)
def test_meta_device_init_then_to_empty_matches_a_normal_build(overrides):
    """Large-model init: shapes on `meta`, memory with to_empty(), values from init_weights() alone."""
    cfg = ModelConfig(
        **{**dict(vocab_size=512, hidden_size=128, n_layers=4, n_heads=4, max_seq_len=16, init_std=0.05), **overrides}
    )
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


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"tie_embeddings": False},
        {"norm": "layernorm", "mlp": "gelu"},
        {"mlp": "geglu", "n_kv_heads": 1},
        {"norm": "none"},
        {"norm": "rmsnorm_bf16", "qk_norm": True},
        {"norm": "none", "qk_norm": True},
    ],
)
def test_param_counts_match_formulas_and_add_up(overrides):
    model = Transformer(tiny_model_config(**overrides))
    counts = model.param_counts()
    assert counts == {**expected_counts(model.cfg), "total": counts["total"]}
    assert counts["total"] == sum(v for k, v in counts.items() if k != "total")
    assert counts["total"] == sum(p.numel() for p in model.parameters())


def test_param_count_of_llama_7b():
    # Meta's published 7B shape must come to its well-known 6,738,415,616 parameters (32000 = 500·64: no padding).
    cfg = ModelConfig(
        vocab_size=32000,
        hidden_size=4096,
        n_layers=32,
        n_heads=32,
        multiple_of=256,
        max_seq_len=2048,
        norm_eps=1e-6,
        tie_embeddings=False,
    )
    with torch.device("meta"):  # shapes only: no memory, no init time
        model = Transformer(cfg)
    assert model.param_counts()["total"] == 6_738_415_616


# ---- training FLOPs per token (Transformer.token_flops) ----------------------------------------------------------

# vocab 128 (a multiple of 64: no padding), d 32, 2 layers, 4 query heads of 8, 2 k/v heads, MLP width 64.
TINY = dict(vocab_size=128, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, intermediate_size=64, max_seq_len=16)


def full_attention_flops_per_token(n_layers: int, n_heads: int, head_dim: int, seq_len: int) -> int:
    """PaLM's non-causal 12·L·d·T: every query scores every key (the masked half too)."""
    return n_layers * n_heads * head_dim * 12 * seq_len


def test_hand_count_of_a_tiny_gqa_model():
    weights, attention = Transformer(ModelConfig(**TINY)).token_flops(seq_len=16)
    q, k, v, o = 32 * 32, 32 * 16, 32 * 16, 32 * 32  # GQA: k and v project to 2 heads × 8
    mlp = 32 * 2 * 64 + 64 * 32  # fused gate+up, then down
    head = 128 * 32  # tied to the embedding, but its matmul still runs
    assert weights == 6 * (2 * (q + k + v + o + mlp) + head) == 135_168
    # Causal: query i scores i+1 keys, 16·17/2 = 136 pairs per head per window, i.e. 8.5 per token;
    # 2·8 FLOPs for QKᵀ + 2·8 for attention·V per pair, ×3 for backward, 4 heads, 2 layers.
    assert attention == 2 * 4 * 3 * (2 * 8 + 2 * 8) * 136 // 16 == 6_528
    assert weights + attention == 141_696
    assert Transformer(ModelConfig(**TINY)).flops_per_token(16) == 141_696.0


def test_causal_term_is_half_the_full_square_plus_the_diagonal():
    with torch.device("meta"):  # GPT-2 small's shape: 12 layers, 12 heads of 64
        model = Transformer(ModelConfig(vocab_size=128, hidden_size=768, n_layers=12, n_heads=12, max_seq_len=1024))
    for T in (1, 16, 1024):
        full = full_attention_flops_per_token(12, 12, 64, T)
        assert full == 12 * 12 * 768 * T  # PaLM's 12·L·d·T
        assert model.token_flops(T)[1] * 2 * T == full * (T + 1)


def counted(model, x, backend=None):
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(backend) if backend else torch.enable_grad(), counter:
        model(x).sum().backward()
    return {str(op): n for op, n in counter.get_flop_counts()["Global"].items()}


def test_matches_flop_counter_mode_on_a_tiny_model():
    """FlopCounterMode counts what the kernels do; the difference from ours is only the attention:

    - with the math SDPA backend attention is bmm's over the full T×T scores (the masked half is
      computed, then discarded): forward 2 bmm, backward 4 — PaLM's non-causal 12·L·d·T;
    - its fused-kernel formulas (flash/efficient/cudnn, CUDA) also count the full square, plus the
      scores recomputed in backward (2.5× forward, not 2×); the CPU flash kernel has no formula and
      counts 0. Model FLOPs count neither the masked half nor the recomputation.
    """
    model = Transformer(ModelConfig(**TINY))
    x = torch.randint(0, 128, (3, 16))
    weights, attention = model.token_flops(16)
    counts = counted(model, x, SDPBackend.MATH)
    tokens = x.numel()
    assert counts["aten.mm"] == weights * tokens  # every Linear: forward, grad-input, grad-weight
    assert counts["aten.bmm"] == full_attention_flops_per_token(2, 4, 8, 16) * tokens
    assert counts["aten.bmm"] * 17 == attention * tokens * 2 * 16
    assert counted(model, x)["aten.mm"] == weights * tokens  # the default kernel: same weights


def test_flops_count_an_untied_head_and_padded_vocab():
    tied = Transformer(ModelConfig(**TINY)).token_flops(16)[0]
    untied = Transformer(ModelConfig(**{**TINY, "tie_embeddings": False})).token_flops(16)[0]
    assert untied == tied  # same matmuls: tying shares storage, not work
    padded = Transformer(ModelConfig(**{**TINY, "vocab_size": 100})).token_flops(16)[0]
    assert padded == tied  # 100 pads to 128 rows, and the head computes all of them


def test_flops_work_on_the_meta_device():
    with torch.device("meta"):
        model = Transformer(ModelConfig(**TINY))
    assert sum(model.token_flops(16)) == 141_696


@pytest.mark.parametrize("seq", [16, 8])
def test_flops_default_to_max_seq_len(seq):
    model = Transformer(ModelConfig(**TINY))
    assert model.flops_per_token() == model.flops_per_token(16)
    assert model.token_flops() == model.token_flops(16)
    assert model.flops_per_token(seq) == float(sum(model.token_flops(seq)))


# ---- μP, the model's half (ModelConfig's multipliers, docs/mup.md) -------------------------------------------------


@pytest.fixture
def single_thread():
    with one_thread():
        yield


def mup_config(**overrides) -> ModelConfig:
    """hidden 32 over base 16: m = 2, head_dim 8 over a base head_dim of 4."""
    return tiny_model_config(**{"parametrization": "mup", "mup_base_width": 16, **overrides})


@pytest.mark.usefixtures("single_thread")
def test_at_the_base_width_mup_is_sp():
    ids = torch.randint(0, 61, (2, 12), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    sp = Transformer(tiny_model_config())
    torch.manual_seed(0)
    mup = Transformer(mup_config(mup_base_width=32))
    assert all(torch.equal(a, b) for a, b in zip(sp.state_dict().values(), mup.state_dict().values()))
    torch.testing.assert_close(mup(ids), sp(ids), rtol=0, atol=1e-6)


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(
    "overrides", [dict(), dict(tie_embeddings=False), dict(n_kv_heads=3, hidden_size=48, n_heads=6)]
)
def test_forward_matches_the_float64_reference_with_mups_scales(overrides):
    model = random_transformer(mup_config(**overrides))
    assert model.cfg.width_multiplier != 1 and model.cfg.attention_scale != 1 / math.sqrt(model.cfg.head_dim)
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids).double()
    torch.testing.assert_close(ours, reference_forward(model, ids), rtol=0, atol=1e-5)
    as_if_sp = reference_forward(random_transformer(dataclasses.replace(model.cfg, parametrization="sp")), ids)
    assert (ours - as_if_sp).abs().max() > 1e-2  # the scales matter: sp's math is measurably other


@pytest.mark.usefixtures("single_thread")
def test_init_scales_the_blocks_matrices_by_one_over_sqrt_m_and_nothing_else():
    def stds(width, parametrization):
        torch.manual_seed(0)
        model = Transformer(
            ModelConfig(
                vocab_size=512,
                hidden_size=width,
                n_layers=2,
                n_heads=4,
                tie_embeddings=False,
                parametrization=parametrization,
                mup_base_width=64,
            )
        )
        std = lambda p: p.detach().std().item()  # noqa: E731
        return (
            std(model.layers[0].attn.q_proj.weight),
            std(model.layers[1].mlp.gate_up_proj.weight),
            std(model.layers[0].attn.o_proj.weight) * math.sqrt(4),
            std(model.embed_tokens.weight),
            std(model.lm_head.weight),
            model.layers[0].attn_norm.weight.mean().item(),
        )

    q, gate_up, o_depth_undone, embedding, head, gain = stds(256, "mup")  # m = 4
    assert q == pytest.approx(0.01, rel=0.03) and gate_up == pytest.approx(0.01, rel=0.03)
    assert o_depth_undone == pytest.approx(0.01, rel=0.03)  # the depth scaling on top: 1/sqrt(2·n_layers)
    assert embedding == pytest.approx(0.02, rel=0.03) and head == pytest.approx(0.02, rel=0.03) and gain == 1.0
    assert stds(256, "sp")[:2] == pytest.approx((0.02, 0.02), rel=0.03)


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize("tie", [True, False])
def test_every_path_to_logits_gets_the_output_multiplier(tie):
    model = random_transformer(mup_config(tie_embeddings=tie))
    ids = torch.randint(0, 61, (3, 17), generator=torch.Generator().manual_seed(2))
    x, y = ids[:, :-1], ids[:, 1:]
    logits = model(x)
    with torch.no_grad():
        torch.testing.assert_close(logits, model.lm_head(model.hidden_states(x)) / 2, rtol=0, atol=1e-6)
    expected = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    one_shot = CausalLMLoss(model, chunk_above=None)(x, y)
    chunked = CausalLMLoss(model, chunk_above=0, chunk_elements=61 * 5)(x, y)  # 5 tokens a chunk
    torch.testing.assert_close(one_shot, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(chunked, expected, rtol=0, atol=1e-6)
    cache = model.new_kv_cache(3)
    with torch.no_grad():
        model(x[:, :9], cache)
        cached_step = model(x[:, 9:10], cache)[:, -1]  # what KV-cached generation reads
    torch.testing.assert_close(cached_step, logits[:, 9].detach(), rtol=0, atol=1e-5)
    greedy = generate_ids(model, [ids[0, :9].tolist()], 6, temperature=0)
    assert greedy == generate_ids(model, [ids[0, :9].tolist()], 6, temperature=0, use_cache=False)
    assert greedy[0][0] == int(logits[0, 8, :61].argmax())  # padding ids are never generated


@pytest.mark.usefixtures("single_thread")
@pytest.mark.parametrize(
    "overrides", [dict(), dict(tie_embeddings=False), dict(n_kv_heads=1), dict(mup_attention_scale="sp")]
)
def test_the_folded_sp_model_computes_the_same_logits(overrides):
    """interop/hf_export.py's as_standard: what the Hugging Face export writes for a mup model."""
    model = random_transformer(mup_config(**overrides))
    sp_cfg, state = as_standard(model.cfg, model.state_dict())
    assert (sp_cfg.parametrization, sp_cfg.tie_embeddings) == ("sp", False)
    assert torch.equal(state["embed_tokens.weight"], model.embed_tokens.weight)  # the input side is untouched
    folded = Transformer(sp_cfg)
    folded.load_state_dict(state)
    ids = torch.randint(0, 61, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(folded(ids), model(ids), rtol=0, atol=1e-5)
    assert as_standard(tiny_model_config(), state) == (tiny_model_config(), state)  # sp: nothing to fold


def test_flops_and_parameter_counts_do_not_depend_on_the_parametrization():
    with torch.device("meta"):
        sp, mup = Transformer(tiny_model_config()), Transformer(mup_config())
    assert sp.param_counts() == mup.param_counts()
    assert sp.flops_per_token() == mup.flops_per_token()


@pytest.mark.usefixtures("single_thread")
def test_the_attention_scale_arm_keeps_every_other_mup_scale():
    """model.mup_attention_scale=sp (docs/mup.md's experiment): SDPA's 1/sqrt(d) under mup, the float64 reference
    agrees, and the rest of μP (init, output multiplier) is what mup_config gives."""
    cfg = mup_config(mup_attention_scale="sp")
    assert cfg.attention_scale is None and mup_config().attention_scale is not None
    model = random_transformer(cfg)
    ids = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(model(ids).double(), reference_forward(model, ids), rtol=0, atol=1e-5)


@pytest.mark.usefixtures("single_thread")
def test_zero_query_init_zeroes_only_the_query_projection():
    """Every score is 0 at init (uniform attention); k, v and every other weight are the draws of the same seed."""
    torch.manual_seed(0)
    plain = Transformer(mup_config())
    torch.manual_seed(0)
    zero_q = Transformer(mup_config(zero_query_init=True))
    for (name, a), b in zip(plain.state_dict().items(), zero_q.state_dict().values()):
        if name.endswith("q_proj.weight"):
            assert a.abs().sum() > 0 and not b.any(), name
        else:
            assert torch.equal(a, b), name


# ---- dropout: each one the model documents, applied in training only, at its rate ------------------------------

RATE = 0.25


def dropout_block(n_heads: int = 4):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, hidden_size=64, n_layers=1, n_heads=n_heads, max_seq_len=64, dropout=RATE)
    model = Transformer(cfg)
    return model, model.layers[0]


def zero_share(t: torch.Tensor) -> float:
    return (t == 0).float().mean().item()


def capture(module, into: dict, key: str, inputs: bool = False):
    """A hook keeping a module's output (or first input) under `key`."""
    if inputs:
        return module.register_forward_pre_hook(lambda m, args: into.__setitem__(key, args[0].detach().clone()))
    return module.register_forward_hook(lambda m, args, out: into.__setitem__(key, out.detach().clone()))


@pytest.mark.parametrize("training", [True, False])
def test_the_attention_sublayers_output_is_dropped_at_the_rate_in_training_only(training):
    """What the block adds to the residual stream after attention is the attention's output with dropout
    (resid_dropout): RATE of its entries zeroed, the rest scaled by 1/(1 − RATE) — in eval mode, the output itself."""
    model, block = dropout_block()
    model.train(training)
    seen, x = {}, torch.randint(0, 64, (8, 64))
    hooks = [capture(block.attn, seen, "attn"), capture(block.attn_norm, seen, "x", inputs=True)]
    hooks.append(capture(block.mlp_norm, seen, "after", inputs=True))
    model(x)
    for h in hooks:
        h.remove()
    added, attn = seen["after"] - seen["x"], seen["attn"]
    if not training:
        torch.testing.assert_close(added, attn)
        return
    kept = added != 0
    assert abs(zero_share(added) - RATE) < 0.02
    torch.testing.assert_close(added[kept], attn[kept] / (1 - RATE), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_the_mlps_output_is_dropped_at_the_rate_in_training_only(training):
    model, block = dropout_block()
    model.train(training)
    seen = {}
    hooks = [capture(block.mlp.down_proj, seen, "down"), capture(block.mlp, seen, "out")]
    model(torch.randint(0, 64, (8, 64)))
    for h in hooks:
        h.remove()
    if not training:
        torch.testing.assert_close(seen["out"], seen["down"])
        return
    kept = seen["out"] != 0
    assert abs(zero_share(seen["out"]) - RATE) < 0.02
    torch.testing.assert_close(seen["out"][kept], seen["down"][kept] / (1 - RATE), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_the_attention_weights_are_dropped_at_the_rate_in_training_only(training):
    """One token attends to itself alone, its weight 1: with dropout on the weights, each head's output is either 0
    (dropped, RATE of the time) or its value vector / (1 − RATE); in eval mode always its value vector."""
    model, block = dropout_block(n_heads=8)
    model.train(training)
    seen = {}
    hooks = [capture(block.attn.v_proj, seen, "v"), capture(block.attn.o_proj, seen, "heads", inputs=True)]
    with torch.no_grad():
        model(torch.randint(0, 64, (4096, 1)))  # many one-token sequences: many independent draws
    for h in hooks:
        h.remove()
    heads, v = seen["heads"].view(4096, 8, -1), seen["v"].view(4096, 8, -1)
    dropped = (heads == 0).all(-1)
    if not training:
        assert not dropped.any()
        torch.testing.assert_close(heads, v)
        return
    assert abs(dropped.float().mean().item() - RATE) < 0.03
    torch.testing.assert_close(heads[~dropped], v[~dropped] / (1 - RATE), rtol=1e-4, atol=1e-5)
