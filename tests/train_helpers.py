"""Helpers for tests that run train.py as a user would: a subprocess with Hydra overrides."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from tests import forked
from training.program import compose_train_config

REPO = Path(__file__).resolve().parents[1]


# A plain `python train.py` (with or without injected faults) is forked from a server that has
# imported torch once (tests/forked.py): a real process, ~6 s cheaper. MINILLAMA_TEST_FORK=0: exec each.
FORK = os.environ.get("MINILLAMA_TEST_FORK", "1") != "0"


def launch(launcher: list, args: list, check: bool = True, timeout: int = 300, popen: bool = False):
    """`<launcher> train.py <args>` from the repo root, no wandb; Popen if popen, else run to the end."""
    args = [*launcher, str(REPO / "train.py"), *args]
    env = {**os.environ, "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    # torchrun's own interpreter is forked too (its workers start as torchrun starts them): ~3 s cheaper
    torchrun = launcher[:3] == [sys.executable, "-m", "torch.distributed.run"]
    forkable = FORK and (launcher == [sys.executable] or forked.faults_of(launcher) is not None or torchrun)
    if forkable:
        script_args, faults = args[1 if torchrun else len(launcher) :], forked.faults_of(launcher)
        if popen:
            return forked.ForkedRun(script_args, env, REPO, faults)
        proc = forked.run(script_args, env, REPO, timeout, faults)
    elif popen:
        return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    else:
        proc = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


# MFU against a given peak: each run skips the 0.3 s matmul probe (measured where a test names
# trainer.peak_tflops=null: test_loop's header, test_train's first run).
GIVEN_PEAK = "trainer.peak_tflops=1"


def tiny_args(tmp_path: Path, overrides: tuple, cache_dir: Path = None) -> list:
    """debug=tiny with outputs and the data cache under tmp_path, one thread, a given peak."""
    return [
        "debug=tiny",
        f"outputs_dir={tmp_path / 'outputs'}",
        f"data.cache_dir={cache_dir or tmp_path / 'cache'}",
        "trainer.num_threads=1",
        GIVEN_PEAK,
        *overrides,
    ]


def run_train(
    tmp_path: Path, *overrides: str, cache_dir: Path = None, check: bool = True, timeout: int = 300, popen: bool = False
):
    """`python train.py debug=tiny …`."""
    return launch([sys.executable], tiny_args(tmp_path, overrides, cache_dir), check, timeout, popen)


def run_torchrun(
    tmp_path: Path,
    nproc: int,
    *overrides: str,
    cache_dir: Path,
    check: bool = True,
    timeout: int = 300,
    faults: dict = None,
):
    """`torchrun --standalone --nproc_per_node=N train.py debug=tiny …` (gloo on CPU), with faults
    injected into every worker by tests/fault_injection.py if given."""
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    if faults:
        launcher += [str(REPO / "tests" / "fault_injection.py"), json.dumps(faults)]
    return launch(launcher, tiny_args(tmp_path, overrides, cache_dir), check, timeout)


def run_ranks(
    tmp_path: Path, nproc: int, *overrides: str, cache_dir: Path, faults: dict = None, timeout: int = 300
) -> subprocess.CompletedProcess:
    """N ranks of `train.py debug=tiny …` started as torchrun starts them — the environment it gives each
    worker (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, …) — but forked from the preloaded server,
    ~8 s cheaper than torchrun's fresh interpreters. For tests of what the ranks compute; what torchrun
    itself does (signals, a hung rank, exit statuses) is tested through run_torchrun. Output: rank 0's;
    the return code: the first non-zero one. MINILLAMA_TEST_FORK=0: run_torchrun instead."""
    if not FORK:
        return run_torchrun(tmp_path, nproc, *overrides, cache_dir=cache_dir, timeout=timeout, faults=faults)
    import socket

    with socket.socket() as probe:  # a free port for the rendezvous store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args = [str(REPO / "train.py"), *tiny_args(tmp_path, overrides, cache_dir)]
    base = {
        **os.environ,
        "WANDB_MODE": "disabled",
        "HYDRA_FULL_ERROR": "0",
        "OMP_NUM_THREADS": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0",
        "TORCHELASTIC_RUN_ID": "tests",
    }
    ranks = [forked.ForkedRun(args, {**base, "RANK": str(r), "LOCAL_RANK": str(r)}, REPO, faults) for r in range(nproc)]
    try:
        outputs = [rank.communicate(timeout=timeout) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    code = next((rank.returncode for rank in ranks if rank.returncode), 0)
    if code:
        raise AssertionError(f"rank failed ({code}):\n" + "\n".join(out[-2000:] + err[-2000:] for out, err in outputs))
    return subprocess.CompletedProcess(args, code, *outputs[0])


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


def run_faulty(
    tmp_path: Path,
    faults: dict,
    *overrides: str,
    cache_dir: Path = None,
    check: bool = True,
    timeout: int = 300,
    popen: bool = False,
):
    """`python train.py debug=tiny …` with faults injected by tests/fault_injection.py."""
    launcher = [sys.executable, str(REPO / "tests" / "fault_injection.py"), json.dumps(faults)]
    return launch(launcher, tiny_args(tmp_path, overrides, cache_dir), check, timeout, popen)


def wait_for_step(run_root: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> Path:
    """Block until a run under run_root has logged a train row at >= step since this call began
    (rows of an earlier process in the same run directory do not count); returns its run dir."""
    since = time.time()
    deadline = since + timeout
    while time.time() < deadline:
        try:
            found = list(run_root.glob("**/metrics.jsonl"))
        except FileNotFoundError:  # a folder removed mid-walk (a resume discards Hydra's unused run dir)
            found = []
        for metrics in found:
            try:
                rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.endswith("}")]
            except FileNotFoundError:
                continue
            if any(r.get("kind") == "train" and r["step"] >= step and r["time"] >= since for r in rows):
                return metrics.parent
        if proc.poll() is not None:
            raise AssertionError(f"train.py ended ({proc.returncode}) before step {step}: {proc.stderr.read()[-2000:]}")
        time.sleep(0.05)
    raise AssertionError(f"no train row at step {step} within {timeout} s")


# ---- train.py's loop in this process: no interpreter + torch + dynamo start (~6 s a launch) --------


def train_in_process(run_dir: Path, *overrides: str, cache_dir: Path, resume_ckpt: Path = None):
    """A `python train.py debug=tiny <overrides>` run (one process; a resume of `resume_ckpt` if given, with
    the same overrides) in this process, writing into run_dir: the same loop, checkpoints and metrics.jsonl.
    Returns the loop's Outcome."""
    import torch

    from data import prepare
    from training.checkpoint import Resume, data_identity
    from training.distributed import DistInfo
    from training.loop import RunSpec, train

    cfg, config_yaml = compose_train_config(
        ["debug=tiny", f"data.cache_dir={cache_dir}", "trainer.num_threads=1", GIVEN_PEAK, *overrides]
    )
    data = prepare(cfg.data, seq_len=cfg.trainer.seq_len, model_vocab_size=cfg.model.vocab_size, log=lambda *a: None)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(config_yaml)
    threads = torch.get_num_threads()
    try:
        resume = Resume.open(resume_ckpt) if resume_ckpt is not None else None
        if resume is not None:  # the checks train.py makes (training/cli.py's resolve_config, then after prepare)
            resume.check_fits(cfg.model)
            resume.check_data(data_identity(data.meta, data.dir), cfg.resume_changed_data)
        return train(RunSpec(cfg, run_dir, config_yaml, resume), DistInfo(), data)
    finally:
        torch.set_num_threads(threads)


def torchrun_worker(parent: int, rank: int, timeout: float = 30) -> int:
    """The pid of the torchrun worker under `parent` whose environment says RANK=rank (read from /proc)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for proc_dir in Path("/proc").iterdir():
            if not proc_dir.name.isdigit():
                continue
            try:
                ppid = int((proc_dir / "stat").read_text().rsplit(")", 1)[1].split()[1])
                environ = (proc_dir / "environ").read_bytes().split(b"\0")
            except (OSError, IndexError, ValueError):
                continue
            if ppid == parent and f"RANK={rank}".encode() in environ:
                return int(proc_dir.name)
        time.sleep(0.1)
    raise AssertionError(f"no worker with RANK={rank} under pid {parent}")


def running(pid: int) -> bool:
    """Whether pid is a live process (not gone, not a zombie waiting to be reaped)."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False
