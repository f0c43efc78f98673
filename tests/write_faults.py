"""Real write faults for tests/test_write_errors.py, run as a child process (limits and mounts stay in it).

    python -m tests.write_faults MODE[,MODE…] DIR (from the repository root), each mode working in DIR/MODE:
    readonly-dir   a folder without write permission
    fsize          ulimit -f: optimizer.pt (torch) fails, then model.safetensors (last: the limit stays)
    tmpfs          mounts a small tmpfs (run it inside `unshare -m`): disk full in torch.save, in
                   safetensors, then the mount turned read-only
Each case saves step 1, breaks the disk, tries step 2 (keep_last=1) and prints one JSON line.
"""

import json
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import torch

from model import ModelConfig, Transformer
from training.checkpoint import CheckpointWriteError, list_checkpoints, read_weights, save_checkpoint, tokenizer_files

CFG = ModelConfig(vocab_size=300, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


def trained_model():
    torch.manual_seed(0)
    model = Transformer(CFG)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()  # so optimizer.pt holds moments: about twice the weights' size
    return model, optimizer


def save(root: Path, step: int, model, optimizer):
    tokenizer = root.parent / "tokenizer.json"
    if not tokenizer.exists():
        tokenizer.write_text("{}")
    return save_checkpoint(
        root,
        step,
        model.state_dict(),
        CFG,
        tokenizer_files(tokenizer),
        {"step": step},
        "",
        optimizer.state_dict(),
        keep_last=1,
    )


def attempt(case: str, root: Path, model, optimizer) -> None:
    """Try step 2 on the broken disk and report what the user would see and what is left on disk."""
    try:
        save(root, 2, model, optimizer)
        message = None
    except CheckpointWriteError as e:
        message = str(e)
    previous = root / "step_0000001"
    weights = read_weights(Transformer(CFG), previous) if (previous / "model.safetensors").exists() else None
    intact = weights is not None and all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    print(
        json.dumps(
            {
                "case": case,
                "message": message,
                "entries": sorted(p.name for p in root.iterdir()),
                "checkpoints": [p.name for p in list_checkpoints(root)],
                "previous_intact": intact,
            }
        ),
        flush=True,
    )


def fill(folder: Path, leave: int) -> None:
    """Write a filler file so that about `leave` bytes stay free on folder's disk."""
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def fsize(root: Path) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # Python's default too: EFBIG instead of a killed process
    model, optimizer = trained_model()
    first = save(root, 1, model, optimizer)
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    # model.safetensors fits, optimizer.pt (twice the size) does not: torch.save's failure.
    resource.setrlimit(resource.RLIMIT_FSIZE, ((first / "model.safetensors").stat().st_size + 4096, hard))
    attempt("fsize-torch", root, model, optimizer)
    resource.setrlimit(resource.RLIMIT_FSIZE, (16384, hard))  # now model.safetensors fails: safetensors' failure
    attempt("fsize-safetensors", root, model, optimizer)


def tmpfs(mount_point: Path) -> None:
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount_point)], check=True)
    root = mount_point / "checkpoints"
    model, optimizer = trained_model()
    first = save(root, 1, model, optimizer)
    written_before = [p for p in first.iterdir() if p.suffix in (".safetensors", ".json", ".yaml")]
    before_optimizer = sum(-(-p.stat().st_size // 4096) * 4096 for p in written_before)  # whole 4 KiB pages
    fill(mount_point, before_optimizer + 16384)  # everything up to optimizer.pt fits
    attempt("enospc-torch", root, model, optimizer)
    (mount_point / "filler").unlink()
    fill(mount_point, 8192)
    attempt("enospc-safetensors", root, model, optimizer)
    (mount_point / "filler").unlink()
    subprocess.run(["mount", "-o", "remount,ro", str(mount_point)], check=True)
    attempt("erofs", root, model, optimizer)


def readonly_dir(root: Path) -> None:
    model, optimizer = trained_model()
    save(root, 1, model, optimizer)
    root.chmod(0o555)  # (root loses its override of this in the test: setpriv drops CAP_DAC_OVERRIDE)
    try:
        attempt("eacces", root, model, optimizer)
    finally:
        root.chmod(0o755)


if __name__ == "__main__":
    modes = {
        "readonly-dir": lambda d: readonly_dir(d / "checkpoints"),
        "fsize": lambda d: fsize(d / "checkpoints"),
        "tmpfs": tmpfs,
    }
    for mode in sys.argv[1].split(","):
        folder = Path(sys.argv[2]) / mode
        folder.mkdir(parents=True, exist_ok=True)
        modes[mode](folder)
