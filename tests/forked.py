"""Run `python train.py …` as a real child process, forked from a server that has already imported torch.

A fresh interpreter spends ~6 s of a 2-core machine importing torch, Hydra and torch._dynamo before
train.py does anything: most of a tiny test run. multiprocessing's forkserver imports them once, in
a process that never computes (forking after OpenMP work can deadlock), and forks one child per run.
The child is a real process — its own pid, signal handlers and exit status — running train.py
through runpy with the given argv, environment and working directory, its stdout/stderr in files.
`ForkedRun` answers the subset of subprocess.Popen the tests use.
"""

import json
import multiprocessing
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# What every run imports anyway; datasets only for cold caches, still worth it once for all runs.
PRELOAD = [
    "torch",
    "torch._dynamo",
    "torch.optim",
    "hydra",
    "training.cli",
    "training.program",
    "training.loop",
    "tests.fault_injection",
    "datasets",
    "tokenizers",
]
_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _child(
    script: str, args: list, env: dict, cwd: str, out_path: str, err_path: str, faults, in_path: str = os.devnull
) -> None:
    """In the forked child: become `python <script> <args>` with this env and cwd, stdin from in_path,
    output to files."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path, flags in (
        (0, in_path, os.O_RDONLY),
        (1, out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
        (2, err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
    ):
        if fd == 2 and err_path == out_path:  # stderr=STDOUT: one file, one offset
            os.dup2(1, 2)
            continue
        target = os.open(path, flags, 0o644)
        os.dup2(target, fd)
        os.close(target)
    sys.stdin = open(0, "r", closefd=False)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    for sig in (signal.SIGINT, signal.SIGTERM):  # as in a fresh interpreter
        signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
    if script == "-m":  # `python -m <module> <args>`: the module found from the repository (lab, dev)
        script, *args = args
        run = lambda: runpy.run_module(script, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        run = lambda: runpy.run_path(script, run_name="__main__")  # noqa: E731
        sys.path.insert(0, os.path.dirname(os.path.abspath(script)))  # as `python <script>` starts: its folder first
    sys.argv = [script, *args]
    if faults is not None:
        from tests.fault_injection import install

        install(faults)
    code = 0
    try:
        run()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            print(e.code, file=sys.stderr)
    except BaseException:  # an uncaught error: the traceback a fresh interpreter would print
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class ForkedRun:
    """subprocess.Popen-like handle of a forked train.py run (text mode, output read at the end)."""

    def __init__(
        self, args: list, env: dict, cwd: Path, faults=None, input: str = None, log: str = None, stdin: str = os.devnull
    ):
        self._dir = tempfile.mkdtemp(prefix="forked-run-")
        weakref.finalize(self, shutil.rmtree, self._dir, True)  # the output files go with the handle
        self._out, self._err = os.path.join(self._dir, "stdout"), os.path.join(self._dir, "stderr")
        if log is not None:  # Popen(stdout=<a file>, stderr=STDOUT): both streams into that file
            self._out = self._err = log
        if input is not None:  # else stdin reads the file at `stdin` (a terminal's path: a run on a tty)
            stdin = os.path.join(self._dir, "stdin")
            Path(stdin).write_text(input)
        self.args, self.returncode = args, None
        self._process = _context().Process(
            target=_child, daemon=False, args=(args[0], args[1:], env, str(cwd), self._out, self._err, faults, stdin)
        )
        self._process.start()
        self.pid = self._process.pid
        self.stdout, self.stderr = _LateFile(self._out), _LateFile(self._err)

    def poll(self):
        if self.returncode is None and self._process.exitcode is not None:
            self.returncode = self._process.exitcode
        return self.returncode

    def wait(self, timeout=None):
        self._process.join(timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout=None):
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class _LateFile:
    """The child's output file, read once the child has ended (or as it is so far)."""

    def __init__(self, path: str):
        self.path = path

    def read(self) -> str:
        try:
            with open(self.path, newline="", errors="replace") as f:  # a "\r" stays a "\r"
                return f.read()
        except FileNotFoundError:
            return ""


def run(
    args: list, env: dict, cwd: Path, timeout: float, faults=None, input: str = None
) -> subprocess.CompletedProcess:
    proc = ForkedRun(args, env, cwd, faults, input)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(30)
        raise
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def run_script(
    script, *args, timeout: float = 120, input: str = None, env: dict = None, cwd: Path = REPO
) -> subprocess.CompletedProcess:
    """`python <script> <args>` as a forked real process: a script test without the interpreter start."""
    return run([str(script), *map(str, args)], dict(os.environ if env is None else env), cwd, timeout, input=input)


def faults_of(launcher: list):
    """The fault spec when `launcher` is `python tests/fault_injection.py SPEC`, else None."""
    if len(launcher) == 3 and launcher[1].endswith("fault_injection.py"):
        return json.loads(launcher[2])
    return None


if __name__ == "__main__":  # a quick check: python tests/forked.py train.py debug=tiny ...
    t0 = time.time()
    done = run([str(REPO / "train.py"), *sys.argv[2:]], dict(os.environ), REPO, 600)
    print(done.returncode, f"{time.time() - t0:.1f} s", done.stdout[-300:], done.stderr[-300:])


def popen_forking_train_py(real_popen, scripts=("train.py",)):
    """A subprocess.Popen stand-in (for monkeypatching) that forks `python train.py …` commands (or of the
    other `scripts`) and hands every other command to real_popen: for code under test that launches them itself."""

    def popen(command, cwd=None, env=None, **kwargs):
        command = list(command)
        if (
            len(command) >= 2
            and command[0] == sys.executable
            and command[1].endswith(scripts)
            and kwargs.get("preexec_fn") is None
        ):
            out = kwargs.get("stdout")
            log = (
                out.name
                if kwargs.get("stderr") == subprocess.STDOUT and isinstance(getattr(out, "name", None), str)
                else None
            )
            return ForkedRun(
                command[1:], dict(env if env is not None else os.environ), Path(cwd or os.getcwd()), log=log
            )
        return real_popen(command, cwd=cwd, env=env, **kwargs)

    return popen
