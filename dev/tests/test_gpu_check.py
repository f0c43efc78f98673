"""dev/gpu_check.sh: its CPU-side dry run, its refusal without a GPU, and that -m cuda selects real tests."""

import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "dev" / "gpu_check.sh"


def run(*args):
    env = {"PATH": "/usr/bin:/bin", "PY": sys.executable}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=120, cwd="/", env=env)


def test_dry_run_lists_the_tests_and_the_benchmark_and_exits_0():
    proc = run("--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert any("-m pytest -q -m cuda tests/test_cuda.py" in line for line in lines)
    assert any("bash dev/bench_gpu.sh" in line for line in lines)
    budget = sum(int(line.split("≤ ")[1].split(" s]")[0]) for line in lines if "≤ " in line)
    assert budget <= 8 * 60  # the whole check must fit in 8 minutes even when every step uses its limit


def test_without_a_gpu_it_says_so_in_one_line():
    if torch.cuda.is_available():
        return  # on a GPU machine the real check would start here
    proc = run()
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: no CUDA GPU here") and len(proc.stderr.strip().splitlines()) == 1


def test_unknown_argument_is_an_error():
    proc = run("--fast")
    assert proc.returncode == 2 and "error: unknown argument '--fast'" in proc.stderr


def test_cuda_marker_selects_the_gpu_tests(request):
    """What `pytest -m cuda tests/test_cuda.py` (the script's command) selects: read off this session's own
    collection when it includes tests/test_cuda.py (the whole suite does), else from a collecting pytest."""
    ours = [item for item in request.session.items if item.nodeid.startswith("tests/test_cuda.py::")]
    if ours:
        collected = [item.nodeid for item in ours if item.get_closest_marker("cuda") is not None]
        assert collected == [item.nodeid for item in ours]  # every test there is a GPU test
    else:
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "cuda", "tests/test_cuda.py"],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        collected = [line for line in proc.stdout.splitlines() if line.startswith("tests/test_cuda.py::")]
    names = " ".join(collected)
    for topic in ("bf16", "chunked", "compile", "kv_cache", "hugging_face", "resume", "fsdp2"):
        assert topic in names, topic
