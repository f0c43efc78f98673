"""Muon: torch's update exactly (bf16), the same iteration in fp32, the Muon/AdamW split, exact
resume through the checkpoint's state-dict path, and Muon under DDP/FSDP2 with torchrun (an FSDP2
checkpoint resumed in one process)."""

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from model import ModelConfig, Transformer
from tests.train_helpers import read_metrics, run_dirs, run_ranks, run_train
from training.checkpoint import full_model_state, full_optimizer_state, load_full_state
from training.config import OptimConfig
from training.optim import Muon, apply_schedule, build_optimizers, hidden_matrices, newton_schulz

COEFFS = (3.4445, -4.775, 2.0315)


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=64, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16, **kw))


@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 88)])
def test_bf16_newton_schulz_is_torchs_bitwise(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(
        newton_schulz(g, COEFFS, 5, 1e-7, torch.bfloat16), _zeropower_via_newtonschulz(g, COEFFS, 5, 1e-7)
    )


def test_fp32_newton_schulz_is_the_same_iteration_in_more_precision():
    g = torch.randn(96, 32, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    exact = newton_schulz(g, COEFFS, 5, 1e-7, torch.float64)
    fp32 = newton_schulz(g.float(), COEFFS, 5, 1e-7, torch.float32).double()
    bf16 = newton_schulz(g.float(), COEFFS, 5, 1e-7, torch.bfloat16).double()
    assert (fp32 - exact).abs().max() < 1e-5 < (bf16 - exact).abs().max()
    # What the iteration is for: singular values pulled from anywhere towards 1 (≈ U Vᵀ), the
    # quintic's known band of roughly (0.7, 1.2) for 5 steps, whatever the gradient's spectrum.
    s = torch.linalg.svdvals(exact)
    assert s.min() > 0.6 and s.max() < 1.25 and torch.linalg.svdvals(g).max() / torch.linalg.svdvals(g).min() > 3


@pytest.mark.parametrize("nesterov", [True, False])
def test_muon_step_is_torchs_in_bf16_and_leaves_the_momentum_buffer_alone_in_fp32(nesterov):
    ours, theirs, fp32 = (
        torch.nn.Parameter(torch.randn(24, 16, generator=torch.Generator().manual_seed(2))) for _ in range(3)
    )
    kwargs = dict(lr=0.02, weight_decay=0.1, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
    opts = [
        Muon([ours], **kwargs),
        torch.optim.Muon([theirs], **kwargs),
        Muon([fp32], ns_dtype=torch.float32, **kwargs),
    ]
    for step in range(3):
        grad = torch.randn(24, 16, generator=torch.Generator().manual_seed(10 + step))
        for p, opt in zip((ours, theirs, fp32), opts):
            p.grad = grad.clone()
            opt.step()
        if step == 0:  # buffer = (1 - momentum) · grad after one step, never the normalised update
            torch.testing.assert_close(opts[2].state[fp32]["momentum_buffer"], 0.05 * grad)
    assert torch.equal(ours, theirs)
    torch.testing.assert_close(fp32, theirs, atol=2e-3, rtol=0)  # bf16 rounding of the update only
    assert not torch.equal(fp32, theirs)


@pytest.mark.parametrize("tie", [True, False])
def test_muon_gets_the_block_matrices_and_adamw_everything_else(tie):
    model = tiny_model(tie_embeddings=tie)
    muon, adamw = build_optimizers(model, OptimConfig(name="muon"), "cpu")
    names = {id(p): n for n, p in model.named_parameters()}
    muon_names = {names[id(p)] for g in muon.param_groups for p in g["params"]}
    adamw_names = [names[id(p)] for g in adamw.param_groups for p in g["params"]]
    assert muon_names == {n for n in names.values() if n.endswith("_proj.weight") and n.startswith("layers.")}
    assert len(muon_names) == 2 * 6  # q, k, v, o, gate_up, down per layer
    assert set(adamw_names) == set(names.values()) - muon_names and len(adamw_names) == len(set(adamw_names))
    decayed = {names[id(p)] for g in adamw.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    assert decayed == (set() if tie else {"lm_head.weight"})  # the embedding (= a tied head) is never decayed
    assert muon.defaults["adjust_lr_fn"] == "match_rms_adamw" and muon.defaults["weight_decay"] == 0.1
    wrapped = torch.nn.Sequential(model)  # a wrapper (DDP, the loss module) changes nothing
    assert [id(p) for p in hidden_matrices(wrapped)] == [id(p) for p in hidden_matrices(model)]


def test_schedule_sets_muon_to_muon_lr_times_the_same_curve():
    cfg = OptimConfig(name="muon", lr=1e-3, min_lr=1e-4, warmup_steps=10, muon_lr=0.02)
    opts = build_optimizers(tiny_model(), cfg, "cpu")
    for step in (0, 50, 99):
        lr = apply_schedule(opts, step, cfg, 100)
        assert opts[1].param_groups[0]["lr"] == lr
        assert opts[0].param_groups[0]["lr"] == pytest.approx(lr * 20)


def _train(model, opts, cfg, steps, max_steps=8):
    for step in steps:
        apply_schedule(opts, step, cfg, max_steps)
        x = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(step))
        torch.nn.functional.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten()).backward()
        for opt in opts:
            opt.step()
            opt.zero_grad(set_to_none=True)


@pytest.mark.parametrize("schedule", ["cosine", "wsd"])
def test_resume_through_the_checkpoint_state_dicts_is_bitwise(tmp_path, schedule):
    cfg = OptimConfig(name="muon", lr=1e-2, min_lr=1e-3, warmup_steps=2, schedule=schedule, muon_ns_dtype="fp32")
    straight = tiny_model()
    opts = build_optimizers(straight, cfg, "cpu")
    _train(straight, opts, cfg, range(8))

    part = tiny_model()
    opts = build_optimizers(part, cfg, "cpu")
    _train(part, opts, cfg, range(3))
    torch.save(full_optimizer_state(part, opts), tmp_path / "optimizer.pt")  # as the checkpoint does
    model_state = {k: v.clone() for k, v in full_model_state(part).items()}
    resumed = tiny_model(seed=1)  # other weights, fresh optimizers: everything must come from the files
    opts = build_optimizers(resumed, cfg, "cpu")
    load_full_state(resumed, opts, model_state, torch.load(tmp_path / "optimizer.pt", weights_only=True))
    assert opts[0].state and opts[1].state  # momentum buffers and Adam moments both came back
    _train(resumed, opts, cfg, range(3, 8))
    for (name, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), name


# fp32 so the only differences left under torchrun are summation order; every step logged.
# fp32 throughout, Newton–Schulz too (auto picks bf16 on bf16 CPUs): rank layouts are compared to 1e-3, which
# bf16's rounding of the orthogonalised update, taken in another order per layout, would exceed.
FAST = [
    "optim=muon",
    "optim.schedule=wsd",
    "trainer.precision=fp32",
    "optim.muon_ns_dtype=fp32",
    "trainer.log_interval=1",
    "trainer.eval_interval=12",
    "trainer.ckpt_interval=6",
    "trainer.max_steps=12",
]


@pytest.fixture(scope="module")
def cache_dir(tiny_data_cache):
    return tiny_data_cache  # debug=tiny's data, prepared once per session (tests/fixtures.py)


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory, cache_dir):
    """12 uninterrupted Muon steps in one process, global batch 4 (debug=tiny): the run the others must equal."""
    root = tmp_path_factory.mktemp("reference")
    run_train(root, *FAST, cache_dir=cache_dir)
    (run,) = run_dirs(root)
    return run


def _losses(run):
    return [r["loss"] for r in read_metrics(run) if r["kind"] == "train"]


def _weights(run, step):
    from safetensors.torch import load_file

    return load_file(run / "checkpoints" / f"step_{step:07d}" / "model.safetensors")


@pytest.mark.serial
def test_train_with_muon_learns_and_resumes_bitwise(tmp_path, cache_dir, reference_run):
    run_train(tmp_path, *FAST, "trainer.stop_at_step=6", cache_dir=cache_dir)
    (part,) = run_dirs(tmp_path)
    run_train(tmp_path, f"resume={part}", cache_dir=cache_dir)
    losses = _losses(reference_run)
    assert losses[-1] < losses[0] - 0.3
    assert _losses(part) == losses
    wf, wp = _weights(reference_run, 12), _weights(part, 12)
    assert all(torch.equal(wf[k], wp[k]) for k in wf)


@pytest.mark.distributed
@pytest.mark.serial
@pytest.mark.parametrize("parallel", ["ddp", "fsdp"])
def test_muon_under_torchrun_matches_one_process(tmp_path, cache_dir, reference_run, parallel):
    """2 ranks × batch 2 = the reference's batch 4. Under FSDP2 each matrix is sharded by rows and
    Newton–Schulz on the DTensor redistributes, so it orthogonalises the whole matrix. The FSDP2 run's
    step-6 checkpoint (Muon and AdamW state gathered from the shards) resumes on the same two ranks bitwise
    (losses and weights), then in ONE process and ends where the reference does."""
    run_ranks(tmp_path, 2, *FAST, "trainer.micro_batch_size=2", f"trainer.parallel={parallel}", cache_dir=cache_dir)
    (multi,) = run_dirs(tmp_path)
    assert _losses(multi) == pytest.approx(_losses(reference_run), rel=1e-4)
    ws, wm = _weights(reference_run, 12), _weights(multi, 12)
    for k in ws:
        torch.testing.assert_close(ws[k], wm[k], rtol=1e-3, atol=1e-5, msg=k)
    if parallel == "fsdp":
        straight = {r["step"]: r["loss"] for r in read_metrics(multi) if r["kind"] == "train"}
        run_ranks(
            tmp_path,
            2,
            f"resume={multi / 'checkpoints' / 'step_0000006'}",
            "trainer.micro_batch_size=2",
            "trainer.parallel=fsdp",
            cache_dir=cache_dir,
        )
        again = {r["step"]: r["loss"] for r in read_metrics(multi) if r["kind"] == "train"}  # last row per step
        assert again == straight
        wa = _weights(multi, 12)
        assert all(torch.equal(wm[k], wa[k]) for k in wm)
        run_train(
            tmp_path,
            f"resume={multi / 'checkpoints' / 'step_0000006'}",
            "trainer.micro_batch_size=4",
            cache_dir=cache_dir,
        )
        resumed = {r["step"]: r["loss"] for r in read_metrics(multi) if r["kind"] == "train"}  # last row per step
        reference = {r["step"]: r["loss"] for r in read_metrics(reference_run) if r["kind"] == "train"}
        assert [resumed[s] for s in range(7, 13)] == pytest.approx([reference[s] for s in range(7, 13)], rel=1e-4)
        wr = _weights(multi, 12)
        for k in ws:
            torch.testing.assert_close(ws[k], wr[k], rtol=1e-3, atol=1e-5, msg=k)


@pytest.mark.parametrize(
    "bf16_fast, ns_dtype, expected",
    [
        (False, "auto", torch.float32),
        (True, "auto", torch.bfloat16),
        (False, "bf16", torch.bfloat16),
        (True, "fp32", torch.float32),
    ],
)
def test_every_muon_option_reaches_the_optimizer(bf16_fast, ns_dtype, expected):
    """auto: Newton–Schulz in bf16 where bf16 matmuls are fast (the caller says), else fp32; named: as named."""
    cfg = OptimConfig(
        name="muon",
        lr=1e-3,
        muon_lr=0.02,
        weight_decay=0.05,
        muon_momentum=0.9,
        muon_ns_steps=3,
        muon_ns_dtype=ns_dtype,
        beta1=0.8,
        eps=1e-7,
    )
    muon, adamw = build_optimizers(tiny_model(), cfg, "cpu", bf16_fast=bf16_fast)  # only the choices: nothing steps
    assert muon.ns_dtype == expected
    d = muon.defaults
    assert (d["lr"], d["weight_decay"], d["momentum"], d["nesterov"], d["ns_steps"]) == (0.02, 0.05, 0.9, True, 3)
    assert adamw.defaults["lr"] == 1e-3 and adamw.defaults["betas"][0] == 0.8 and adamw.defaults["eps"] == 1e-7


@pytest.mark.parametrize(
    "hardware, cap, expected",
    [
        ("amx", None, torch.bfloat16),
        ("avx512_bf16", None, torch.bfloat16),
        ("avx2", None, torch.float32),
        ("amx", "AVX2", torch.float32),
        ("amx", "AVX512_CORE_BF16", torch.bfloat16),
    ],
)
def test_auto_newton_schulz_is_bf16_where_the_cpu_has_bf16_matmuls(hardware, cap, expected, monkeypatch):
    """Every CPU class, whatever this machine is: its flags faked, a cap as ONEDNN_MAX_CPU_ISA sets it; the optimizers
    built as training/loop.py's build() does, with bf16_fast from the device."""
    import platform

    from training.distributed import bf16_fast

    monkeypatch.setattr(platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(torch.cpu, "_is_avx2_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: hardware == "amx")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: hardware in ("amx", "avx512_bf16"))
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    else:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    fast, _ = bf16_fast(torch.device("cpu"))
    muon, _ = build_optimizers(tiny_model(), OptimConfig(name="muon", muon_ns_dtype="auto"), "cpu", fast)
    assert muon.ns_dtype == expected


def test_muon_without_block_matrices_is_a_clear_error():
    with pytest.raises(ValueError) as raised:
        build_optimizers(torch.nn.Linear(4, 4), OptimConfig(name="muon"), "cpu")
    assert str(raised.value) == "optim.name=muon found no matrices inside transformer blocks; use optim=adamw"
