"""Helpers for tests that run train.py as a user would: a subprocess with Hydra overrides."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _run(launcher: list, tmp_path: Path, overrides: tuple, cache_dir: Path, check: bool, timeout: int):
    """`<launcher> train.py debug=tiny …` with outputs and the data cache under tmp_path, no wandb."""
    args = [*launcher, str(REPO / "train.py"), "debug=tiny", f"outputs_dir={tmp_path / 'outputs'}",
            f"data.cache_dir={cache_dir or tmp_path / 'cache'}", "trainer.num_threads=1", *overrides]
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(launcher[-2:])} failed ({proc.returncode}):\n"
                             f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def run_train(tmp_path: Path, *overrides: str, cache_dir: Path = None, check: bool = True, timeout: int = 300):
    """`python train.py debug=tiny …`."""
    return _run([sys.executable], tmp_path, overrides, cache_dir, check, timeout)


def run_torchrun(tmp_path: Path, nproc: int, *overrides: str, cache_dir: Path, check: bool = True,
                 timeout: int = 300):
    """`torchrun --standalone --nproc_per_node=N train.py debug=tiny …` (gloo on CPU)."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return _run(launcher, tmp_path, overrides, cache_dir, check, timeout)


def run_dirs(tmp_path: Path) -> list:
    return sorted(p.parent for p in (tmp_path / "outputs").glob("*/*/config.yaml"))


def read_metrics(run_dir: Path) -> list:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
