"""The code reproduces the committed golden loss curves (tests/golden_curve.py; re-bless there), fp32 and bf16.

Tolerance: on CPU a run is deterministic for a given machine and thread count, but CI machines
differ (AVX2, AVX-512, AMX), and with them the order in which oneDNN/MKL sum inside each matmul.
Those differences are ~1e-7 relative per op in fp32 and grow through 30 steps of training. We
measured the growth by re-running the curves with 2 threads instead of 1 (another blocking, so
another summation order): at most 5.7e-6 nats at any step (docs/testing.md). TOLERANCE is ~170×
that, and still >10× smaller than what a 1 % change of the learning rate does to the curve
(1.3e-2 and 2.6e-2 measured; a test checks it each run).

bf16: each class of bf16 hardware has its own curve (tests/golden_curve.py says why). Within a class,
1 and 2 threads gave the same curve to the bit, and MKL's instruction set (AVX2 vs AVX-512, for the
few fp32 matmuls left) moved it by 1.5e-4; BF16_TOLERANCE is ~13× that. Between classes the curves
are 1.8e-3 to 5.4e-3 apart, and each is 1.4e-3 to 3.1e-3 from the fp32 curve: so a class needs its
own curve, and "bf16 really ran" is held by test_step.py (the ops' dtypes) and test_train.py.
"""

import json

import pytest
import torch

import tests.golden_curve as golden_curve
from tests.golden_curve import GOLDEN, STEPS, VARIANTS, bf16_class, computes_as_its_class, loss_curve

pytestmark = pytest.mark.serial  # trains: one at a time under make test's two workers (tests/fixtures.py)

TOLERANCE = 1e-3  # nats, per step
BF16_TOLERANCE = 2e-3  # nats, per step, against this machine's class of bf16 hardware


@pytest.fixture(scope="module")
def golden():
    return json.loads(GOLDEN.read_text())


@pytest.fixture(scope="module")
def curves(tiny_data_cache, tmp_path_factory):
    work = tmp_path_factory.mktemp("golden")
    return {v: loss_curve(v, tiny_data_cache, work) for v in [*VARIANTS, "bf16"]}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_reproduces_the_golden_loss_curve(golden, curves, variant):
    expected, got = golden["losses"][variant], curves[variant]
    assert len(got) == len(expected) == STEPS
    worst = max(abs(a - b) for a, b in zip(got, expected))
    assert worst <= TOLERANCE, (
        f"{variant}: the loss curve moved by up to {worst:.2e} (tolerance {TOLERANCE}); "
        "if the change is intended, re-bless: .venv/bin/python tests/golden_curve.py"
    )


def test_the_curves_learn_and_the_tolerance_tells_the_variants_apart(golden):
    curves = [golden["losses"][v] for v in sorted(VARIANTS)]
    for curve in curves:
        assert curve[-1] < curve[0] - 0.5  # they are training curves, not noise
    for i, a in enumerate(curves):  # another recipe, or another data order, is far outside the tolerance
        assert all(max(abs(x - y) for x, y in zip(a, b)) > 10 * TOLERANCE for b in curves[i + 1 :])


def test_a_one_percent_learning_rate_change_moves_the_curve_beyond_the_tolerance(
    golden, tiny_data_cache, tmp_path, monkeypatch
):
    monkeypatch.setitem(golden_curve.VARIANTS, "rmsnorm_swiglu", ["optim.lr=0.00303"])  # the default 3e-3, +1 %
    moved = loss_curve("rmsnorm_swiglu", tiny_data_cache, tmp_path)
    assert max(abs(a - b) for a, b in zip(moved, golden["losses"]["rmsnorm_swiglu"])) > 5 * TOLERANCE


def test_reproduces_the_bf16_golden_curve_of_this_cpus_class(golden, curves):
    cls = bf16_class()
    if not computes_as_its_class():
        pytest.skip(
            f"this process caps oneDNN to {cls} but runs ATen's {torch.backends.cpu.get_cpu_capability()} "
            f"kernels, a mix no real CPU has: test_cpu_classes.py checks the {cls} curve with the full caps"
        )
    assert set(golden["bf16_losses"]) == {"amx", "avx512_bf16", "avx2"}  # every class this code may meet
    expected, got = golden["bf16_losses"][cls], curves["bf16"]
    assert len(got) == len(expected) == STEPS
    worst = max(abs(a - b) for a, b in zip(got, expected))
    assert worst <= BF16_TOLERANCE, (
        f"bf16 on {cls}: the loss curve moved by up to {worst:.2e} (tolerance "
        f"{BF16_TOLERANCE}); if intended: .venv/bin/python tests/golden_curve.py"
    )


def test_each_bf16_curve_learns_and_is_not_the_fp32_curve(golden):
    fp32 = golden["losses"]["rmsnorm_swiglu"]
    for cls, curve in golden["bf16_losses"].items():
        assert curve[-1] < curve[0] - 0.5, cls
        assert 1e-3 < max(abs(a - b) for a, b in zip(curve, fp32)) < 2e-2, cls  # bf16, and close to fp32


def test_a_one_percent_learning_rate_change_moves_the_bf16_curve_beyond_its_tolerance(
    golden, tiny_data_cache, tmp_path, monkeypatch
):
    monkeypatch.setattr(golden_curve, "BF16_VARIANT", [*golden_curve.BF16_VARIANT, "optim.lr=0.00303"])
    moved = loss_curve("bf16", tiny_data_cache, tmp_path)
    assert max(abs(a - b) for a, b in zip(moved, golden["bf16_losses"][bf16_class()])) > 5 * BF16_TOLERANCE
