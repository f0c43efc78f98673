"""scripts/estimate.py: parameters, FLOPs and time, the simulated memory against a real step, the verdict; and the
memory readings it and the training log take (the CPU peak follows a real allocation and can be reset; CUDA reads
the allocator)."""

import json
import re
import sys

import pytest
import torch

from model import Transformer
from scripts import estimate
from tests.train_helpers import REPO, launch, tiny_args
from training import distributed as D
from training.log import peak_memory_bytes
from training.program import compose_run_config, exit_status

TINY = [
    "model=tiny",
    "data.vocab_size=512",
    "trainer.micro_batch_size=4",
    "trainer.seq_len=64",
    "trainer.precision=fp32",
    "trainer.device=cpu",
]


def run(capsys, *argv) -> tuple:
    status = exit_status(estimate.main, list(argv))
    out = capsys.readouterr()
    return status, out.out, out.err


def number_after(text: str, label: str) -> float:
    return float(re.search(re.escape(label) + r"\s*([\d,.]+)", text).group(1).replace(",", ""))


def test_parameters_flops_and_time_of_the_tiny_config(capsys, tmp_path):
    status, out, err = run(
        capsys, *TINY, f"outputs_dir={tmp_path}", "--device-memory-gb", "100", "--peak-tflops", "2", "--mfu", "0.25"
    )
    assert status == 0, err
    cfg = compose_run_config(TINY)
    model = __import__("model").Transformer(cfg.model)
    assert f"{model.param_counts()['total']:,} parameters" in out
    tokens = 4 * 64
    assert f"= {tokens:,} tokens" in out
    per_step = model.flops_per_token(64) * tokens
    assert f"= {per_step / 1e12:,.3f} TFLOP per step" in out
    ideal = per_step / 2e12
    assert f"{ideal:,.2f} s at 100 % MFU" in out and f"{ideal / 0.25:,.2f} s per step" in out
    assert "verdict: fits" in out


def test_a_config_that_does_not_fit_gets_a_micro_batch_that_does(capsys, tmp_path):
    big = [*TINY, "trainer.micro_batch_size=64", f"outputs_dir={tmp_path}"]
    cfg = compose_run_config(big)
    mem = estimate.simulate(cfg, "fp32", "auto")
    fixed = mem.peak - mem.activations + estimate.CUDA_OVERHEAD
    memory_gb = (fixed + 0.5 * mem.activations) / estimate.HEADROOM / 1e9  # about half the activations fit
    status, out, _ = run(
        capsys, *big, "--device", "cuda", "--device-memory-gb", f"{memory_gb:.4f}", "--peak-tflops", "1"
    )
    assert status == 0 and "verdict: does NOT fit" in out, out
    suggested = int(number_after(out, "trainer.micro_batch_size="))
    accum = int(number_after(out, "trainer.grad_accum_steps="))
    assert 1 <= suggested < 64 and suggested * accum >= 64  # no fewer tokens per step
    status, out, _ = run(
        capsys,
        *TINY,
        f"trainer.micro_batch_size={suggested}",
        f"outputs_dir={tmp_path}",
        "--device",
        "cuda",
        "--device-memory-gb",
        f"{memory_gb:.4f}",
        "--peak-tflops",
        "1",
    )
    assert "verdict: fits" in out


def test_activations_grow_with_the_micro_batch_and_chunking_removes_logits_copies():
    cfg = compose_run_config(TINY)
    small, double = (
        estimate.simulate(compose_run_config([*TINY, f"trainer.micro_batch_size={b}"]), "fp32", "auto").activations
        for b in (4, 8)
    )
    assert 1.8 < double / small < 2.2
    big_vocab = compose_run_config([*TINY, "data.vocab_size=32768"])
    one_shot, chunked = (estimate.simulate(big_vocab, "fp32", c) for c in (None, 0))
    logits = 4 * 64 * 32768 * 4
    assert one_shot.peak - chunked.peak > 1.2 * logits  # log-softmax output and its gradient, mostly
    assert cfg.model.vocab_size == 512


def test_simulated_peak_matches_a_measured_step(tmp_path):
    # The default CPU model at micro-batch 4: every live tensor of a real step, counted by MemTracker.
    overrides = [
        "trainer.micro_batch_size=4",
        "trainer.precision=fp32",
        "trainer.device=cpu",
        f"outputs_dir={tmp_path}",
    ]
    cfg = compose_run_config(overrides)
    mem = estimate.simulate(cfg, "fp32", "auto")
    real = estimate.simulate(cfg, "fp32", "auto", fake=False)
    measured = real.peak - real.weights - real.buffers
    assert abs((mem.peak - mem.weights - mem.buffers) / measured - 1) < 0.05  # fake vs real tensors


def test_mfu_comes_from_the_newest_run_of_the_same_model(capsys, tmp_path):
    cfg = compose_run_config([*TINY, f"outputs_dir={tmp_path}"])
    from omegaconf import OmegaConf

    for name, model_cfg, mfu in (("old", cfg.model, 0.1), ("other_model", {"hidden_size": 1}, 0.9)):
        run_dir = tmp_path / "2026-01-01" / name
        run_dir.mkdir(parents=True)
        (run_dir / "config.yaml").write_text(OmegaConf.to_yaml({"model": OmegaConf.structured(model_cfg)}))
        rows = [{"kind": "train", "step": s, "mfu": 0.01 if s < 30 else mfu} for s in range(10, 70, 10)]
        (run_dir / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    status, out, _ = run(capsys, *TINY, f"outputs_dir={tmp_path}", "--peak-tflops", "1")
    assert status == 0 and "at MFU 10.0 %" in out and "old/metrics.jsonl" in out  # not the other model's 90 %


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["model=nope"], "model"),
        (["trainer.micro_batch_size=0"], "trainer.micro_batch_size=0"),
        (["--mfu-from", "/nonexistent/run"], "--mfu-from /nonexistent/run"),
        ([*TINY, "--gpu", "NVIDIA L40G", "--device", "cuda"], "--gpu 'NVIDIA L40G'"),
        ([*TINY, "--mfu", "7"], "--mfu 7.0 must be a fraction in (0, 1]"),
        ([*TINY, "--mfu", "0"], "--mfu 0.0 must be a fraction in (0, 1]"),
        ([*TINY, "--device-memory-gb", "-1"], "--device-memory-gb -1.0 must be > 0"),
        ([*TINY, "--peak-tflops", "0"], "--peak-tflops 0.0 must be > 0"),
        ([*TINY, "--world-size", "0"], "--world-size 0 must be >= 1"),
    ],
)
def test_bad_input_is_one_error_line(capsys, argv, expected):
    status, out, err = run(capsys, *argv)
    assert status == 1 and err.startswith("error: ") and len(err.strip().splitlines()) == 1 and expected in err


def test_runs_without_a_gpu_for_a_gpu_target(capsys):
    status, out, _ = run(
        capsys,
        "model=tiny",
        "trainer=gpu",
        "data.vocab_size=32768",
        "trainer.micro_batch_size=4",
        "trainer.seq_len=64",
        "--device",
        "cuda",
        "--device-memory-gb",
        "80",
        "--gpu",
        "NVIDIA H100 80GB HBM3",
        "--mfu",
        "0.4",
    )
    assert status == 0 and "data sheet: H100 SXM" in out and "chunked" in out
    assert torch.cuda.is_available() or "bf16 (" in out


@pytest.mark.parametrize(
    "gpu,gb",
    [
        ("NVIDIA H100 80GB HBM3", 80),
        ("NVIDIA A100-SXM4-40GB", 40),
        ("NVIDIA H200", 141),
        ("NVIDIA L4", 24),
        ("NVIDIA A100", None),
        ("NVIDIA GH200", None),
        ("Some Future GPU", None),
    ],
)
def test_a_gpus_memory_comes_from_its_name_or_its_data_sheet(gpu, gb):
    from scripts.estimate import gpu_memory_bytes

    assert gpu_memory_bytes(gpu) == (gb * 1e9 if gb else None)


def test_a_named_gpu_answers_will_it_fit(capsys):
    """README's "will it fit?" command names a GPU and no memory: the data sheet's memory gives the verdict; a
    model sold with several sizes asks which."""
    args = [
        "trainer=gpu",
        "data.vocab_size=32768",
        "trainer.micro_batch_size=4",
        "trainer.seq_len=64",
        "model=tiny",
        "--device",
        "cuda",
        "--mfu",
        "0.4",
        "--gpu",
    ]
    status, out, _ = run(capsys, *args, "NVIDIA H100 80GB HBM3")
    assert status == 0 and "of 74.51 GiB" in out and "data sheet: NVIDIA H100 80GB HBM3" in out
    assert "verdict: fits" in out, out
    status, out, _ = run(capsys, *args, "NVIDIA A100")
    assert status == 0 and "comes with several memory sizes; name it" in out


def test_the_presets_descriptions_state_their_parameter_counts():
    """A preset's name is a family resemblance (125m: GPT-2 small's shape); its description states the real count
    at the default vocabulary, recomputed here."""
    from pathlib import Path

    from model import Transformer

    for preset, stated in (("125m", "78.7M"), ("25m", "25.7M")):
        cfg = compose_run_config([f"model={preset}"]).model
        with torch.device("meta"):
            total = sum(p.numel() for p in Transformer(cfg).parameters())
        assert f"{total / 1e6:.1f}M" == stated, (preset, total)
        assert stated in Path("README.md").read_text()
    assert (
        "78.7M parameters in all with the default 4,096-token vocabulary" in Path("configs/model/125m.yaml").read_text()
    )


# ---- memory readings: the peak (training/log.py), the current usage and its reset (scripts/estimate.py) ----------

CPU = torch.device("cpu")
MB = 2**20


def reset_peak_memory(device: torch.device) -> bool:
    """Start a new peak from the current usage; False where the platform cannot (non-Linux CPU)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return True
    try:  # Linux: "5" resets the peak RSS (VmHWM, and with it getrusage's ru_maxrss) to the current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def test_cpu_peak_grows_with_an_allocation_and_stays_after_it_is_freed():
    if not reset_peak_memory(CPU):  # an earlier test's higher peak would hide this allocation
        pytest.skip("resetting the peak RSS needs Linux /proc")
    before = peak_memory_bytes(CPU)
    block = torch.ones(200 * MB // 4)  # 200 MB, touched, so resident
    during = peak_memory_bytes(CPU)
    del block
    assert during >= before + 150 * MB  # more than the page cache's noise
    assert peak_memory_bytes(CPU) >= during  # a peak, not the current usage
    assert estimate.current_memory_bytes() < during - 150 * MB


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="resetting the peak RSS needs Linux /proc")
def test_cpu_peak_resets_to_the_current_usage():
    block = torch.ones(200 * MB // 4)
    del block
    assert reset_peak_memory(CPU)
    after_reset = peak_memory_bytes(CPU)
    assert after_reset < estimate.current_memory_bytes() + 50 * MB
    small = torch.ones(80 * MB // 4)
    assert peak_memory_bytes(CPU) >= after_reset + 60 * MB
    del small


def test_cuda_reads_the_allocator(monkeypatch):
    # No GPU needed: what is read on CUDA is the allocator's peak, not the process RSS.
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device: 123)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device: None)
    cuda = torch.device("cuda", 0)
    assert peak_memory_bytes(cuda) == 123 and reset_peak_memory(cuda)


def fake_cgroup(tmp_path, monkeypatch, limit: str, usage: int, inactive: int, v1: bool = False) -> None:
    """A container as the kernel shows it, and 8 GiB of RAM available on the host."""
    (tmp_path / "meminfo").write_text(f"MemTotal: 16000000 kB\nMemAvailable: {8 * 2**20} kB\n")
    (tmp_path / "max").write_text(limit + "\n")
    (tmp_path / "current").write_text(f"{usage}\n")
    key = "total_inactive_file" if v1 else "inactive_file"
    (tmp_path / "stat").write_text(f"anon 1\n{key} {inactive}\n")
    group = (tmp_path / "max", tmp_path / "current", tmp_path / "stat", key)
    monkeypatch.setattr(D, "MEMINFO", tmp_path / "meminfo")
    monkeypatch.setattr(D, "CGROUPS", (group,) if v1 else (group, (tmp_path / "none",) * 3 + (key,)))


@pytest.mark.parametrize("v1", [False, True])
def test_cpu_memory_is_the_containers_limit_less_its_use_not_the_hosts_ram(tmp_path, monkeypatch, v1):
    GiB = 2**30
    own = estimate.current_memory_bytes()
    fake_cgroup(tmp_path, monkeypatch, str(2 * GiB), usage=own + GiB, inactive=GiB // 4, v1=v1)
    room, source = estimate.cpu_memory()
    assert (
        GiB + GiB // 4 - 2**25 < room < GiB + GiB // 4 + 2**25
    )  # page cache is reclaimable, this process is counted apart
    assert "container's limit (2.00 GiB" in source


@pytest.mark.parametrize("limit", ["max", str(2**63 - 4096), "garbled"])
def test_an_unlimited_or_unreadable_limit_leaves_the_hosts_available_ram(tmp_path, monkeypatch, limit):
    fake_cgroup(tmp_path, monkeypatch, limit, usage=0, inactive=0)
    assert estimate.cpu_memory() == (8 * 2**30, "available RAM now (/proc/meminfo)")


def test_a_run_that_would_not_fit_the_containers_limit_says_so(capsys, tmp_path, monkeypatch):
    """scripts/estimate.py in a 300 MiB container: the verdict is the container's, not the host's 8 GiB."""
    own = estimate.current_memory_bytes()
    fake_cgroup(tmp_path, monkeypatch, str(300 * 2**20), usage=own, inactive=0)
    status, out, err = run(capsys, *TINY, f"outputs_dir={tmp_path}", "--device", "cpu", "--peak-tflops", "1")
    assert status == 0, err
    assert "verdict: does NOT fit" in out and "container's limit (300 MiB" in out, out


@pytest.mark.parametrize("room_mib", [0, 4096])
def test_train_py_refuses_in_one_line_a_run_its_container_cannot_hold(tmp_path, room_mib, tiny_data_cache):
    """A run the kernel would kill for memory (exit 137, no line) is refused before it starts; one that fits trains."""
    limit = 8 * 2**30
    (tmp_path / "max").write_text(f"{limit}\n")
    (tmp_path / "current").write_text(f"{limit - room_mib * 2**20}\n")
    (tmp_path / "stat").write_text("anon 1\ninactive_file 0\n")
    faults = json.dumps({"cgroup": [str(tmp_path / name) for name in ("max", "current", "stat")]})
    launcher = [sys.executable, str(REPO / "tests" / "fault_injection.py"), faults]
    done = launch(launcher, tiny_args(tmp_path, ("trainer.max_steps=2",), tiny_data_cache), check=False)
    if room_mib:
        assert done.returncode == 0, done.stderr[-2000:]
        return
    lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
    assert "needs at least" in lines[0] and "container's limit (8.00 GiB" in lines[0] and "leaves 0 MiB" in lines[0]
    assert not list((tmp_path / "outputs").rglob("*.safetensors"))  # nothing trained, nothing saved


@pytest.mark.parametrize("overrides", [[], ["model.mlp=gelu", "trainer.micro_batch_size=4"], ["optim=adamw"]])
def test_train_pys_memory_bound_is_below_the_simulated_peak(overrides):
    """train.py refuses only runs that cannot fit: its lower bound stays under what estimate.py simulates (the
    default model's logits, which it leaves out, make it ~16 % of the simulated peak there)."""
    cfg = compose_run_config(overrides)
    with torch.device("meta"):
        model = Transformer(cfg.model)
    step = estimate.simulate(cfg, "fp32")
    bound = D.least_memory(model, cfg.trainer.micro_batch_size * cfg.trainer.seq_len)
    assert 0.1 * (step.peak - step.weights) < bound < step.peak - step.weights
    two = D.least_memory(model, cfg.trainer.micro_batch_size * cfg.trainer.seq_len, ranks=2)
    assert bound < two < 2 * bound  # a second process adds its activations; its state counts once (FSDP shards it)
