"""Run train.py with faults injected from outside: `python tests/fault_injection.py SPEC train.py ARGS...`.

SPEC is JSON. The faults patch library functions in this process before train.py starts, so the
code under test is the real one — nothing in minillama knows about them:
  {"nan_steps": [3, 4]}          the loss (so every gradient) is NaN at these optimizer steps (1-based)
  {"save_log": "FILE"}           append "<step>" to FILE each time a step checkpoint starts writing
  {"signal_in_save": 15}         send this signal to ourselves in the middle of the first step checkpoint
  {"hang_in_save": "FILE"}       in the middle of the first step checkpoint: create FILE, then sleep
                                 (the test kills the process there: a kill mid-write)
  {"signal_at_step": [5, 15]}    send signal 15 to ourselves after optimizer step 5
  {"signal_at_step": [5, 15, 1]} the same, in the torchrun worker of rank 1 only
  {"val_bpb": [3.0, 2.5]}         the evaluations report these bits per byte, in order (a scripted curve)
  {"slow_prepare": 8}            building the token cache takes 8 s longer (a big corpus), on whichever rank builds
  {"compile_backend": "aot_eager"} torch.compile (trainer.compile=true) uses this backend: dynamo and AOT
                                 autograd as in a real compile, without inductor's minute of C++ builds
  {"teardown_log": "FILE"}       append "<rank> <group up before> <group up after>" to FILE at each process-group teardown
  {"metrics_disk_full_after": 3} metrics.jsonl's disk fills after 3 rows: every later write and the close fail (ENOSPC)
  {"cgroup": [MAX, CURRENT, STAT]} the container's memory files the run reads are these (cgroup v2's layout), and
                                 the host's /proc/meminfo is not read
  {"step_clock": [[0, 0.05], [40, 0.2]]}  the run's clock (training/budget.py clock) reads the seconds its steps
                                 would take: 0.05 s each from step 0, 0.2 s each from step 40; evaluations and
                                 checkpoints take none. A time budget then plans the same steps on every run
  {"unprivileged": true}         root loses the capabilities to override permission bits, as under `setpriv
                                 --bounding-set=-dac_override,-dac_read_search,-fowner` (a read-only folder binds)
"""

import json
import os
import runpy
import sys
import time
from pathlib import Path


def poisoned(real_call, bad_steps):
    """TrainStep.__call__ whose loss (so every gradient) is NaN at these optimizer steps (1-based). In-process
    tests patch it in with monkeypatch (tests/test_loop.py)."""
    bad = set(bad_steps)

    def poisoned_step(self, step):
        if step + 1 not in bad:
            return real_call(self, step)
        real_module = self.loss_module
        self.loss_module = lambda x, y: real_module(x, y) * float("nan")
        try:
            return real_call(self, step)
        finally:
            self.loss_module = real_module

    return poisoned_step


def step_clock(segments: list, setattr_=setattr) -> None:
    """Make the run's clock a function of the steps done: [[from_step, seconds per step], …]. In-process tests
    pass monkeypatch.setattr as setattr_ (tests/test_budget.py)."""
    import training.budget as budget
    import training.checkpoint as checkpoint
    import training.log as log
    import training.loop as loop

    done = {"steps": 0}

    def seconds(n: int) -> float:
        return sum(next(dt for start, dt in reversed(segments) if i >= start) for i in range(n))

    real_call, real_from_json = loop.TrainStep.__call__, checkpoint.RunState.from_json.__func__

    def counted_call(self, step):
        out = real_call(self, step)
        done["steps"] = step + 1
        return out

    def counted_from_json(cls, fields):
        done["steps"] = fields["step"]
        return real_from_json(cls, fields)

    clock = lambda: 1000.0 + seconds(done["steps"])  # noqa: E731
    for module in (budget, checkpoint, log, loop):  # each holds the one clock by name
        setattr_(module, "clock", clock)
    setattr_(loop.TrainStep, "__call__", counted_call)
    setattr_(checkpoint.RunState, "from_json", classmethod(counted_from_json))
    setattr_(loop.Validator, "time_one", lambda self: 0.0)
    setattr_(checkpoint.Checkpointer, "time_one", lambda self: 0.0)


def drop_root_overrides() -> None:
    """Take CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH and CAP_FOWNER out of this process's effective, permitted and
    inheritable sets (capset(2), version 3: two 32-bit words each); a user without them loses nothing."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    sets = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) of capabilities 0-31, then of 32-63
    if libc.capget(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    for i in range(3):
        sets[i] &= ~(1 << 1 | 1 << 2 | 1 << 3)
    if libc.capset(header, sets) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def install(spec: dict) -> None:
    import data.cache as preparation
    import training.checkpoint as saving
    import training.loop as step_module
    import training.loop as validator

    if spec.get("unprivileged"):
        drop_root_overrides()

    if "step_clock" in spec:
        step_clock(spec["step_clock"])

    if "cgroup" in spec:
        import training.distributed as D

        D.MEMINFO, D.CGROUPS = Path("/nonexistent"), ((*map(Path, spec["cgroup"]), "inactive_file"),)

    if "slow_prepare" in spec:
        real_build = preparation._build

        def slow_build(*args, **kwargs):
            time.sleep(spec["slow_prepare"])
            return real_build(*args, **kwargs)

        preparation._build = slow_build

    if "compile_backend" in spec:
        import training.loop as compile_module

        real_init = compile_module.CompiledLoss.__init__

        def init_with_backend(self, module, warn=print, **compile_kwargs):
            real_init(self, module, warn, **{"backend": spec["compile_backend"], **compile_kwargs})

        compile_module.CompiledLoss.__init__ = init_with_backend

    if "teardown_log" in spec:
        import torch.distributed as dist

        import training.distributed as distributed

        real_teardown = distributed.teardown

        def logged_teardown():
            before = dist.is_initialized()
            real_teardown()
            with open(spec["teardown_log"], "a") as f:
                f.write(f"{os.environ.get('RANK', '0')} {before} {dist.is_initialized()}\n")

        distributed.teardown = logged_teardown

    if "metrics_disk_full_after" in spec:
        import errno

        import training.log as metrics

        real_log, budget = metrics.Logger.log, {"rows": spec["metrics_disk_full_after"]}

        class FullDisk:
            def write(self, text):
                raise OSError(errno.ENOSPC, "No space left on device")

            close = flush = lambda self: FullDisk.write(self, "")

        def log_until_full(self, row):
            if budget["rows"] == 0 and self.file is not None:
                self.file = FullDisk()
            budget["rows"] -= 1
            return real_log(self, row)

        metrics.Logger.log = log_until_full

    if "nan_steps" in spec:
        step_module.TrainStep.__call__ = poisoned(step_module.TrainStep.__call__, spec["nan_steps"])

    if "val_bpb" in spec:
        scripted, real_evaluate = list(spec["val_bpb"]), validator.evaluate

        def scripted_evaluate(*args, **kwargs):
            result = real_evaluate(*args, **kwargs)
            return {**result, "val_bpb": scripted.pop(0)}

        validator.evaluate = scripted_evaluate

    if "signal_at_step" in spec:
        at, signum, *only_rank = spec["signal_at_step"]
        real_step_call = step_module.TrainStep.__call__
        here = not only_rank or os.environ.get("RANK", "0") == str(only_rank[0])

        def signalling_step(self, step):
            out = real_step_call(self, step)
            if here and step + 1 == at:
                os.kill(os.getpid(), signum)
            return out

        step_module.TrainStep.__call__ = signalling_step

    if {"save_log", "signal_in_save", "hang_in_save"} & spec.keys():
        real_save = saving.save_checkpoint
        state = {"first": True}

        def faulty_save(root, step, *args, **kwargs):
            if "save_log" in spec and Path(root).name == "checkpoints":
                with open(spec["save_log"], "a") as f:
                    f.write(f"{step}\n")
            first = state["first"] and Path(root).name == "checkpoints"
            state["first"] = state["first"] and not first
            if first and "signal_in_save" in spec:
                os.kill(os.getpid(), spec["signal_in_save"])  # arrives while this save runs
            if first and "hang_in_save" in spec:
                _write_then_hang(spec["hang_in_save"])
            return real_save(root, step, *args, **kwargs)

        saving.save_checkpoint = faulty_save


def _write_then_hang(marker: str) -> None:
    """Let the real writer start the .tmp directory, then stop inside it until killed."""
    import training.checkpoint as checkpoint

    real_write = checkpoint.write_file

    def write_and_hang(path, data):
        real_write(path, data)
        Path(marker).write_text(str(path))
        time.sleep(600)

    checkpoint.write_file = write_and_hang


if __name__ == "__main__":
    spec, script, args = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3:]
    sys.path.insert(0, str(Path(script).resolve().parent))
    install(spec)
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")
