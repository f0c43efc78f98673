"""Helpers for tests that run train.py as a user would: a subprocess with Hydra overrides."""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def launch(launcher: list, args: list, check: bool = True, timeout: int = 300, popen: bool = False):
    """`<launcher> train.py <args>` from the repo root, no wandb; Popen if popen, else run to the end."""
    args = [*launcher, str(REPO / "train.py"), *args]
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    if popen:
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def tiny_args(tmp_path: Path, overrides: tuple, cache_dir: Path = None) -> list:
    """debug=tiny with outputs and the data cache under tmp_path, one thread."""
    return ["debug=tiny", f"outputs_dir={tmp_path / 'outputs'}", f"data.cache_dir={cache_dir or tmp_path / 'cache'}",
            "trainer.num_threads=1", *overrides]


def run_train(tmp_path: Path, *overrides: str, cache_dir: Path = None, check: bool = True, timeout: int = 300,
              popen: bool = False):
    """`python train.py debug=tiny …`."""
    return launch([sys.executable], tiny_args(tmp_path, overrides, cache_dir), check, timeout, popen)


def run_torchrun(tmp_path: Path, nproc: int, *overrides: str, cache_dir: Path, check: bool = True,
                 timeout: int = 300):
    """`torchrun --standalone --nproc_per_node=N train.py debug=tiny …` (gloo on CPU)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return launch(launcher, tiny_args(tmp_path, overrides, cache_dir), check, timeout)


def interrupt_once_training(proc: subprocess.Popen, root: Path, pattern: str, sig: int) -> tuple:
    """Send `sig` once the first metrics row exists under root/pattern; return (stdout, stderr)."""
    deadline = time.time() + 120
    while time.time() < deadline and not list(root.glob(pattern)):
        time.sleep(0.2)
    time.sleep(1.0)  # a few steps in
    proc.send_signal(sig)
    return proc.communicate(timeout=60)


def run_dirs(tmp_path: Path) -> list:
    return sorted(p.parent for p in (tmp_path / "outputs").glob("*/*/config.yaml"))


def read_metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_faulty(tmp_path: Path, faults: dict, *overrides: str, cache_dir: Path = None, check: bool = True,
               timeout: int = 300, popen: bool = False):
    """`python train.py debug=tiny …` with faults injected by tests/fault_injection.py."""
    launcher = [sys.executable, str(REPO / "tests" / "fault_injection.py"), json.dumps(faults)]
    return launch(launcher, tiny_args(tmp_path, overrides, cache_dir), check, timeout, popen)


def wait_for_step(run_root: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> Path:
    """Block until a run under run_root has logged a train row at >= step since this call began
    (rows of an earlier process in the same run directory do not count); returns its run dir."""
    since = time.time()
    deadline = since + timeout
    while time.time() < deadline:
        for metrics in run_root.glob("**/metrics.jsonl"):
            rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
            if any(r.get("kind") == "train" and r["step"] >= step and r["time"] >= since for r in rows):
                return metrics.parent
        if proc.poll() is not None:
            raise AssertionError(f"train.py ended ({proc.returncode}) before step {step}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no train row at step {step} within {timeout} s")
