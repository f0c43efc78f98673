"""Muon: torch's update exactly (bf16), the same iteration in fp32, the Muon/AdamW split, exact
resume through the checkpoint's state-dict path, and Muon under DDP/FSDP2 with torchrun (an FSDP2
checkpoint resumed in one process)."""

import pytest
import torch
from torch.optim._muon import _zeropower_via_newtonschulz

from model import ModelConfig, Transformer
from tests.train_helpers import read_metrics, run_dirs, run_ranks, run_train
from training.checkpoint.state_dicts import full_model_state, full_optimizer_state, load_full_state
from training.config import OptimConfig
from training.optim.muon import Muon, newton_schulz, stacks
from training.optim import apply_schedule, build_optimizers, hidden_matrices

COEFFS = (3.4445, -4.775, 2.0315)


def tiny_model(seed=0, **kw):
    torch.manual_seed(seed)
    return Transformer(ModelConfig(vocab_size=64, hidden_size=32, n_layers=2, n_heads=4, max_seq_len=16, **kw))


@pytest.mark.parametrize("shape", [(32, 32), (96, 32), (32, 88)])
def test_bf16_newton_schulz_is_torchs_bitwise(shape):
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    assert torch.equal(newton_schulz(g, COEFFS, 5, 1e-7, torch.bfloat16), _zeropower_via_newtonschulz(g, COEFFS, 5, 1e-7))


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
    ours, theirs, fp32 = (torch.nn.Parameter(torch.randn(24, 16, generator=torch.Generator().manual_seed(2)))
                          for _ in range(3))
    kwargs = dict(lr=0.02, weight_decay=0.1, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
    opts = [Muon([ours], **kwargs), torch.optim.Muon([theirs], **kwargs), Muon([fp32], ns_dtype=torch.float32, **kwargs)]
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


SHAPES = [(24, 16), (16, 40), (24, 16), (24, 16), (16, 40), (8, 8)]  # tall and wide, repeated, one alone


@pytest.mark.parametrize("nesterov", [True, False])
@pytest.mark.parametrize("skip", [None, 0, 1])
def test_stacked_muon_is_torchs_update_bitwise_in_bf16(nesterov, skip):
    """Same-shape matrices orthogonalised as one stack (optim.muon_ns_stack_mb) give torch's one-at-a-time
    update exactly — and a skipped step (found_inf = 1) leaves weights and momentum as they were."""
    gen = torch.Generator().manual_seed(3)
    start = [torch.randn(s, generator=gen) for s in SHAPES]
    ours, theirs = ([torch.nn.Parameter(w.clone()) for w in start] for _ in range(2))
    kwargs = dict(lr=0.02, weight_decay=0.1, nesterov=nesterov, adjust_lr_fn="match_rms_adamw")
    opt, ref = Muon(ours, **kwargs), torch.optim.Muon(theirs, **kwargs)
    assert stacks(ours, opt.stack_mb) == [[0, 2, 3], [1, 4], [5]]
    if skip is not None:
        opt.found_inf = torch.tensor(float(skip))
    for step in range(3):
        for i, (a, b) in enumerate(zip(ours, theirs)):
            a.grad = torch.randn(a.shape, generator=torch.Generator().manual_seed(10 * step + i))
            b.grad = a.grad.clone()
        opt.step()
        if not skip:
            ref.step()
    for a, b, w in zip(ours, theirs, start):
        assert torch.equal(a, w if skip else b)
    if skip:
        assert all(torch.equal(opt.state[p]["momentum_buffer"], torch.zeros_like(p)) for p in ours)


def test_stacks_are_same_shape_within_the_cap_and_only_in_bf16():
    params = [torch.zeros(s) for s in SHAPES]  # 24 × 16 in bf16: 768 bytes
    assert stacks(params, 0) == [[i] for i in range(6)]  # optim.muon_ns_stack_mb=0: one at a time
    # Two 24 × 16 fit in 1,536 bytes and the third opens a stack; two 16 × 40 (2,560 bytes) do not fit.
    assert stacks(params, 1536 / 2**20) == [[0, 2], [1], [3], [4], [5]]
    for dtype, orthogonalised in ((torch.bfloat16, [(3, 24, 16), (2, 16, 40), (8, 8)]),  # what each step hands
                                  (torch.float32, [tuple(s) for s in SHAPES])):  # Newton–Schulz: stacks in bf16 only
        opt, seen = Muon([torch.nn.Parameter(p.clone()) for p in params], ns_dtype=dtype), []
        with pytest.MonkeyPatch.context() as mp:
            import training.optim.muon as muon_module
            mp.setattr(muon_module, "newton_schulz", lambda g, *a: seen.append(tuple(g.shape)) or g.clone())
            for p in opt.param_groups[0]["params"]:
                p.grad = torch.ones_like(p)
            opt.step()
        assert seen == orthogonalised, dtype
    # The default run's 24 matrices in three stacks, one per shape: 16 of 192 × 192, 4 of 1024 × 192, 4 of 192 × 512.
    from cli.config import compose_train_config
    cfg, _ = compose_train_config(["logger=none"])
    muon = build_optimizers(Transformer(cfg.model), cfg.optim, "cpu")[0]
    assert sorted(map(len, stacks(muon.param_groups[0]["params"], cfg.optim.muon_ns_stack_mb))) == [4, 4, 16]


def test_a_stack_is_orthogonalised_matrix_by_matrix():
    """Each matrix of a stack by its own norm, in its own orientation: the same maths in float64, the same
    bits in bf16 (where Muon stacks)."""
    g = torch.randn(5, 40, 24, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    g[0] *= 100  # norms far apart: one shared norm would show
    exact = newton_schulz(g, COEFFS, 5, 1e-7, torch.float64)
    torch.testing.assert_close(exact, torch.stack([newton_schulz(m, COEFFS, 5, 1e-7, torch.float64) for m in g]))
    bf16 = newton_schulz(g.float(), COEFFS, 5, 1e-7, torch.bfloat16)
    assert bf16.shape == g.shape and torch.equal(bf16, torch.stack([newton_schulz(m, COEFFS, 5, 1e-7, torch.bfloat16)
                                                                    for m in g.float()]))


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
FAST = ["optim=muon", "optim.schedule=wsd", "trainer.precision=fp32", "optim.muon_ns_dtype=fp32", "trainer.log_interval=1",
        "trainer.eval_interval=12", "trainer.ckpt_interval=6", "trainer.max_steps=12"]


@pytest.fixture(scope="module")
def cache_dir(tiny_data_cache):
    return tiny_data_cache  # debug=tiny's data, prepared once per session (tests/conftest.py)


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
    run_ranks(tmp_path, 2, *FAST, "trainer.micro_batch_size=2", f"trainer.parallel={parallel}",
                 cache_dir=cache_dir)
    (multi,) = run_dirs(tmp_path)
    assert _losses(multi) == pytest.approx(_losses(reference_run), rel=1e-4)
    ws, wm = _weights(reference_run, 12), _weights(multi, 12)
    for k in ws:
        torch.testing.assert_close(ws[k], wm[k], rtol=1e-3, atol=1e-5, msg=k)
    if parallel == "fsdp":
        straight = {r["step"]: r["loss"] for r in read_metrics(multi) if r["kind"] == "train"}
        run_ranks(tmp_path, 2, f"resume={multi / 'checkpoints' / 'step_0000006'}", "trainer.micro_batch_size=2",
                  "trainer.parallel=fsdp", cache_dir=cache_dir)
        again = {r["step"]: r["loss"] for r in read_metrics(multi) if r["kind"] == "train"}  # last row per step
        assert again == straight
        wa = _weights(multi, 12)
        assert all(torch.equal(wm[k], wa[k]) for k in wm)
        run_train(tmp_path, f"resume={multi / 'checkpoints' / 'step_0000006'}", "trainer.micro_batch_size=4",
                  cache_dir=cache_dir)
        resumed = {r["step"]: r["loss"] for r in read_metrics(multi) if r["kind"] == "train"}  # last row per step
        reference = {r["step"]: r["loss"] for r in read_metrics(reference_run) if r["kind"] == "train"}
        assert [resumed[s] for s in range(7, 13)] == pytest.approx([reference[s] for s in range(7, 13)], rel=1e-4)
        wr = _weights(multi, 12)
        for k in ws:
            torch.testing.assert_close(ws[k], wr[k], rtol=1e-3, atol=1e-5, msg=k)




@pytest.mark.parametrize("device, ns_dtype, expected", [("cpu", "auto", torch.float32), ("cuda", "auto", torch.bfloat16),
                                                        ("cpu", "bf16", torch.bfloat16), ("cuda", "fp32", torch.float32)])
def test_every_muon_option_reaches_the_optimizer(device, ns_dtype, expected, monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")  # a CPU that emulates bf16: auto keeps Newton–Schulz in fp32
    cfg = OptimConfig(name="muon", lr=1e-3, muon_lr=0.02, weight_decay=0.05, muon_momentum=0.9, muon_ns_steps=3,
                      muon_ns_dtype=ns_dtype, beta1=0.8, eps=1e-7, muon_ns_stack_mb=5)
    muon, adamw = build_optimizers(tiny_model(), cfg, device)  # only the choices: nothing steps here
    assert muon.ns_dtype == expected and muon.stack_mb == 5
    d = muon.defaults
    assert (d["lr"], d["weight_decay"], d["momentum"], d["nesterov"], d["ns_steps"]) == (0.02, 0.05, 0.9, True, 3)
    assert adamw.defaults["lr"] == 1e-3 and adamw.defaults["betas"][0] == 0.8 and adamw.defaults["eps"] == 1e-7


@pytest.mark.parametrize("hardware, cap, expected", [("amx", None, torch.bfloat16), ("avx512_bf16", None, torch.bfloat16),
                                                     ("avx2", None, torch.float32), ("amx", "AVX2", torch.float32),
                                                     ("amx", "AVX512_CORE_BF16", torch.bfloat16)])
def test_auto_newton_schulz_is_bf16_where_the_cpu_has_bf16_matmuls(hardware, cap, expected, monkeypatch):
    """Every CPU class, whatever this machine is: its hardware faked, a cap as ONEDNN_MAX_CPU_ISA sets it."""
    import training.runtime.cpu as cpu
    monkeypatch.setattr(cpu, "_hardware_class", lambda: hardware)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    else:
        monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    muon, _ = build_optimizers(tiny_model(), OptimConfig(name="muon", muon_ns_dtype="auto"), "cpu")
    assert muon.ns_dtype == expected


def test_muon_without_block_matrices_is_a_clear_error():
    with pytest.raises(ValueError) as raised:
        build_optimizers(torch.nn.Linear(4, 4), OptimConfig(name="muon"), "cpu")
    assert str(raised.value) == "optim.name=muon found no matrices inside transformer blocks; use optim=adamw"
