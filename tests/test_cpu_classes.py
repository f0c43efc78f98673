"""The CPU class as an explicit input: what depends on it — `trainer.precision=auto`'s decision and the bf16
golden curve — checked under every class this machine can emulate (ONEDNN_MAX_CPU_ISA and friends, as
tests/golden_curve.py's EMULATE), each in a child process; a class above this machine's hardware cannot be
emulated (a cap only lowers) and is skipped with that reason."""

import json
import os
import subprocess
import sys

import pytest

from tests.golden_curve import EMULATE, GOLDEN, REPO, can_emulate
from tests.test_golden_curve import BF16_TOLERANCE

DECIDE = r"""
import json, sys, torch
from training.loop import resolve_precision
print("RESULT " + json.dumps(resolve_precision("auto", torch.device("cpu"))))
"""


def run_as(cls: str, args: list, timeout: float = 240) -> subprocess.CompletedProcess:
    if not can_emulate(cls):
        pytest.skip(f"this CPU's hardware is below {cls}: a cap (ONEDNN_MAX_CPU_ISA) can lower a class, never raise it")
    env = {**os.environ, **EMULATE[cls], "PYTHONPATH": str(REPO)}
    for key in set(EMULATE["avx2"]) - set(EMULATE[cls]):
        env.pop(key, None)  # this class's caps only, not ones the suite was started with
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO, capture_output=True, text=True, check=True, timeout=timeout
    )


@pytest.mark.parametrize("cls", ["amx", "avx512_bf16", "avx2"])
def test_auto_decides_from_what_each_class_reports(cls):
    """bf16 where the class runs bf16 matmuls in hardware, fp32 where oneDNN would emulate them; the why names what
    the CPU reports (and the cap that lowered it)."""
    precision, why = json.loads(run_as(cls, ["-c", DECIDE]).stdout.split("RESULT ", 1)[1])
    assert (precision == "bf16") == (cls != "avx2") and why.startswith("CPU reports ")
    assert ("bf16 is emulated" in why) == (cls == "avx2")


@pytest.mark.serial  # trains: one at a time (tests/fixtures.py); the precision check above only asks
@pytest.mark.parametrize("cls", ["avx512_bf16", "avx2"])  # this machine's own class: tests/test_golden_curve.py
def test_the_bf16_golden_curve_of_each_class_this_machine_can_emulate(tmp_path, tiny_data_cache, cls):
    from tests.golden_curve import bf16_class, computes_as_its_class

    if cls == bf16_class() and computes_as_its_class():
        pytest.skip(f"{cls} is this machine's own class: tests/test_golden_curve.py reproduces its curve in process")
    out = tmp_path / f"{cls}.json"
    run_as(cls, [str(REPO / "tests" / "golden_curve.py"), "--bf16-only", str(out), "--cache", str(tiny_data_cache)])
    got, expected = json.loads(out.read_text()), json.loads(GOLDEN.read_text())["bf16_losses"][cls]
    worst = max(abs(a - b) for a, b in zip(got, expected))
    assert len(got) == len(expected) and worst <= BF16_TOLERANCE, f"bf16 as {cls}: the curve moved by {worst:.2e}"


@pytest.mark.parametrize(
    "cls, aten, faithful",
    [("avx2", "AVX512", False), ("avx2", "AVX2", True), ("avx512_bf16", "AVX512", True), ("amx", "AVX512", True)],
)
def test_a_process_computes_as_its_class_only_with_the_class_s_aten_kernels(monkeypatch, cls, aten, faithful):
    """ONEDNN_MAX_CPU_ISA=AVX2 alone on an AVX-512 CPU is not an AVX2 CPU (ATen keeps its AVX-512 kernels): the
    in-process bf16 golden curve is then checked in a child with the full caps instead."""
    import torch

    import tests.golden_curve as G

    monkeypatch.setattr(G, "bf16_class", lambda: cls)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: aten)
    assert G.computes_as_its_class() is faithful
