"""training/precision.py: `auto` takes bf16 only where bf16 matmuls are measured fast; autocast contexts."""
import pytest
import torch

from training import precision as P


@pytest.mark.parametrize("bf16_s, fp32_s, expected", [(0.030, 0.001, "fp32"), (0.0004, 0.001, "bf16")])
def test_auto_on_cpu_follows_the_measured_matmul_speed(monkeypatch, bf16_s, fp32_s, expected):
    times = {torch.bfloat16: bf16_s, torch.float32: fp32_s}
    monkeypatch.setattr(P, "_matmul_seconds", lambda dtype: times[dtype])
    chosen, why = P.resolve_precision("auto", torch.device("cpu"))
    assert chosen == expected
    assert ("slower" in why) == (expected == "fp32") and ("faster" in why) == (expected == "bf16")


def test_auto_on_cuda_asks_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert P.resolve_precision("auto", torch.device("cuda", 0)) == ("fp32", "this CUDA device has no bf16")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert P.resolve_precision("auto", torch.device("cuda", 0))[0] == "bf16"
    assert P.resolve_precision("auto", torch.device("mps"))[0] == "fp32"


def test_explicit_choices_are_kept_and_unknown_ones_refused():
    assert P.resolve_precision("bf16", torch.device("cpu")) == ("bf16", "trainer.precision")
    assert P.resolve_precision("fp32", torch.device("cpu")) == ("fp32", "trainer.precision")
    with pytest.raises(ValueError, match="trainer.precision='fp8' is unknown"):
        P.resolve_precision("fp8", torch.device("cpu"))


def test_the_measurement_draws_nothing_from_the_training_generator():
    torch.manual_seed(0)
    before = torch.get_rng_state()
    P.resolve_precision("auto", torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), before)  # a resume stays bitwise


def test_autocast_runs_matmuls_in_bf16_only_when_asked():
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    with P.autocast_context("bf16", torch.device("cpu"))():
        assert (x @ w).dtype == torch.bfloat16
    with P.autocast_context("fp32", torch.device("cpu"))():
        assert (x @ w).dtype == torch.float32


def test_tf32_is_enabled_only_on_cuda(exact_fp32):
    assert not P.enable_tf32(torch.device("cpu")) and not torch.backends.cuda.matmul.allow_tf32
    assert P.enable_tf32(torch.device("cuda", 0))
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
    assert not P.enable_tf32(torch.device("cuda", 0), enabled=False)  # trainer.tf32=false: exact fp32
    assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
