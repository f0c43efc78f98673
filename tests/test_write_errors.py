"""A refused write (disk full, ulimit -f, permissions, read-only) ends in one line naming the file, the
cause and the fix, with the `.tmp` removed, the previous checkpoint intact and nothing pruned. Every file of a
checkpoint is serialized in memory and written by one function (training/checkpoint.py `write_file`), so the cause
is the write's own errno, never guessed from a library's message.

In-process tests inject the OSError a refused write raises; the real-fault tests run tests/write_faults.py in a child
process under a real file-size limit, a real full (tmpfs) disk, a real read-only mount and a real unwritable folder.
"""

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import training.checkpoint
from model import ModelConfig, Transformer
from tests import forked
from training.checkpoint import CheckpointWriteError, read_weights, save_checkpoint, tokenizer_files, write_error_cause

CHILD = ["-m", "tests.write_faults"]  # run from the project root (run_child), which is then on sys.path
CFG = ModelConfig(vocab_size=300, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


# ---- classifying one failed write --------------------------------------------------------------------
@pytest.mark.parametrize(
    "error, cause, fix",
    [
        (
            OSError(errno.ENOSPC, "No space left on device"),
            "no space left on device",
            "free space on the disk holding /run/ck (or lower trainer.keep_last)",
        ),
        (
            PermissionError(errno.EACCES, "Permission denied"),
            "permission denied",
            "make /run/ck writable for this user, or write the run elsewhere (hydra.run.dir=…)",
        ),
        (
            OSError(errno.EROFS, "Read-only file system"),
            "read-only file system",
            "write the run to a writable directory",
        ),
        (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota exceeded", "free space within your quota"),
        (FileNotFoundError(errno.ENOENT, "No such file"), "/run/ck disappeared", "is a second run writing into this"),
        (OSError(errno.EIO, "Input/output error"), "I/O error", "the disk may be failing"),
        (OSError(errno.ENAMETOOLONG, "File name too long"), "file name too long", "fix the disk or write the run"),
    ],
)
def test_each_cause_gets_its_own_fix(error, cause, fix):
    assert write_error_cause(error, Path("/run/ck/model.pt")).startswith(f"{cause} while writing /run/ck/model.pt; ")
    assert fix in write_error_cause(error, Path("/run/ck/model.pt"))


def test_file_too_large_tells_a_ulimit_from_the_file_system(monkeypatch):
    error = OSError(errno.EFBIG, "File too large")
    monkeypatch.setattr(training.checkpoint.resource, "getrlimit", lambda which: (65536, -1))
    assert write_error_cause(error, Path("/r/m")) == (
        "the file-size limit (ulimit -f: 65,536 bytes) was reached "
        "while writing /r/m; raise it (`ulimit -f unlimited`, or the "
        "job scheduler's file-size limit)"
    )
    monkeypatch.setattr(training.checkpoint.resource, "getrlimit", lambda which: (-1, -1))
    assert write_error_cause(error, Path("/r/m")).startswith("file too large for the file system while writing")


# ---- save_checkpoint under injected faults -------------------------------------------------------------
@pytest.fixture
def run(tmp_path):
    torch.manual_seed(0)
    model = Transformer(CFG)
    optimizer = torch.optim.AdamW(model.parameters())
    (tmp_path / "tokenizer.json").write_text("{}")
    root = tmp_path / "checkpoints"

    def save(step):
        return save_checkpoint(
            root,
            step,
            model.state_dict(),
            CFG,
            tokenizer_files(tmp_path / "tokenizer.json"),
            {"step": step},
            "",
            optimizer.state_dict(),
            keep_last=1,
        )

    return root, model, save


def refusing(name: str, code: int):
    """write_file, refusing the file `name` as a disk would: part of it written, then the OSError."""
    real = training.checkpoint.write_file

    def write(path, data):
        if Path(path).name != name:
            return real(path, data)
        real(path, data[: len(data) // 2])
        raise OSError(code, os.strerror(code), str(path))

    return write


def mkdir_denied(self, *args, **kwargs):
    raise PermissionError(errno.EACCES, "Permission denied", str(self))


@pytest.mark.parametrize(
    "fake, file, cause",
    [
        (refusing("optimizer.pt", errno.ENOSPC), "step_0000002.tmp/optimizer.pt", "no space left on device"),
        (refusing("model.safetensors", errno.EFBIG), "step_0000002.tmp/model.safetensors", "file too large"),
        (refusing("model_config.json", errno.EROFS), "step_0000002.tmp/model_config.json", "read-only file system"),
    ],
)
def test_a_failed_save_is_one_line_and_loses_nothing(run, monkeypatch, fake, file, cause):
    root, model, save = run
    previous = save(1)
    monkeypatch.setattr(training.checkpoint.resource, "getrlimit", lambda which: (-1, -1))
    monkeypatch.setattr(training.checkpoint, "write_file", fake)
    with pytest.raises(CheckpointWriteError) as failed:
        save(2)
    monkeypatch.undo()
    message = str(failed.value)
    assert (
        message.startswith(f"cannot save checkpoint step_0000002: {cause}")
        and f"while writing {root / file}; " in message
    )
    assert message.endswith(f"; the last checkpoint, {previous}, is intact") and "\n" not in message
    assert ".tmp" not in message.split("; ", 1)[1]  # the advice names the checkpoints folder, which still exists
    assert sorted(p.name for p in root.iterdir()) == ["step_0000001"]  # no .tmp, and keep_last=1 pruned nothing
    weights = read_weights(Transformer(CFG), previous)
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())


def test_a_folder_that_cannot_be_made_is_one_line_naming_it(run, monkeypatch):
    root, _, save = run
    save(1)
    monkeypatch.setattr("pathlib.Path.mkdir", mkdir_denied)
    with pytest.raises(CheckpointWriteError) as failed:
        save(2)
    assert str(failed.value).startswith(
        f"cannot save checkpoint step_0000002: permission denied while writing {root / 'step_0000002.tmp'}; "
    )


def test_the_first_save_says_there_is_no_earlier_checkpoint(run, monkeypatch):
    root, _, save = run
    monkeypatch.setattr("pathlib.Path.mkdir", mkdir_denied)
    with pytest.raises(CheckpointWriteError, match=r"permission denied .*; no earlier checkpoint exists$"):
        save(1)


def test_a_bug_is_not_disguised_as_a_write_error(run, monkeypatch):
    root, _, save = run
    save(1)
    monkeypatch.setattr("torch.save", lambda obj, f: (_ for _ in ()).throw(RuntimeError("unsupported type in state")))
    with pytest.raises(RuntimeError, match="unsupported type in state") as raised:
        save(2)
    assert not isinstance(raised.value, CheckpointWriteError)
    assert sorted(p.name for p in root.iterdir()) == ["step_0000001"]


# ---- real faults, in a child process ----------------------------------------------------------------
def run_child(args) -> list:
    # From the project root: under mutation testing (docs/testing.md) the child imports the mutated copy,
    # whose trampolines read the mutmut config found in the working directory.
    return results(subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=Path(__file__).parents[1]))


def results(proc) -> list:
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def check_case(result: dict, cause: str, file: str, fix: str) -> None:
    message = result["message"]
    assert message is not None, f"{result['case']}: the save did not fail"
    assert message.startswith(f"cannot save checkpoint step_0000002: {cause}"), message
    assert message.split("; ")[0].endswith(file) and fix in message and "\n" not in message, message
    assert message.endswith("checkpoints/step_0000001, is intact"), message
    assert ".tmp" not in message.split("; ", 1)[1], message  # the advice names a folder that still exists
    assert result["entries"] == ["step_0000001"] and result["previous_intact"], result


@pytest.fixture(scope="module")
def limit_and_permission(tmp_path_factory) -> dict:
    """One child for two real faults: an unwritable folder, then ulimit -f. Forked from the preloaded server
    (tests/forked.py: no torch import to pay), without root's capability to write anywhere (fault_injection.py)."""
    args = [*CHILD, "readonly-dir,fsize", str(tmp_path_factory.mktemp("faults"))]
    proc = forked.run(args, dict(os.environ), forked.REPO, timeout=180, faults={"unprivileged": True})
    return {r["case"]: r for r in results(proc)}


def test_real_file_size_limit(limit_and_permission):
    check_case(
        limit_and_permission["fsize-torch"],
        "the file-size limit (ulimit -f:",
        "step_0000002.tmp/optimizer.pt",
        "ulimit -f unlimited",
    )
    check_case(
        limit_and_permission["fsize-safetensors"],
        "the file-size limit (ulimit -f: 16,384 bytes) was reached",
        "step_0000002.tmp/model.safetensors",
        "raise it",
    )


def test_real_permission_denied(limit_and_permission):
    check_case(limit_and_permission["eacces"], "permission denied", "step_0000002.tmp", "writable for this user")


def mount_namespace() -> list:
    """A command prefix giving a private mount namespace where this user may mount a tmpfs, or skip."""
    reasons = []
    as_root, as_user = (
        ["unshare", "--mount", "--propagation", "private"],
        ["unshare", "--user", "--map-root-user", "--mount"],
    )
    for prefix in (as_root, as_user):
        if shutil.which(prefix[0]) is None:
            pytest.skip("real disk-full test needs `unshare` (util-linux) to mount a private tmpfs")
        probe = subprocess.run(
            prefix + ["sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, text=True
        )
        if probe.returncode == 0:
            return prefix
        reasons.append(probe.stderr.strip().splitlines()[-1] if probe.stderr.strip() else f"exit {probe.returncode}")
    pytest.skip(
        "real disk-full test needs to mount a small tmpfs (root with CAP_SYS_ADMIN, or unprivileged user "
        f"namespaces), which this machine refuses: {'; '.join(reasons)}"
    )


def test_real_full_disk_and_read_only_mount(tmp_path):
    prefix = mount_namespace()
    results = run_child(prefix + [sys.executable, *CHILD, "tmpfs", str(tmp_path)])
    by_case = {r["case"]: r for r in results}
    check_case(
        by_case["enospc-torch"], "no space left on device", "step_0000002.tmp/optimizer.pt", "free space on the disk"
    )
    check_case(
        by_case["enospc-safetensors"],
        "no space left on device",
        "step_0000002.tmp/model.safetensors",
        "lower trainer.keep_last",
    )
    check_case(by_case["erofs"], "read-only file system", "step_0000002.tmp", "write the run to a writable directory")
