"""studies/jobs.py: Ctrl-C forwarding to a multirun, its exit status, and the CPU lock."""
import contextlib
import fcntl
import io
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from studies.jobs import cpu_lock, run_sweep


CHILD = textwrap.dedent("""
    import signal, sys, time
    got = []
    signal.signal(signal.SIGINT, lambda *a: got.append(1))
    print("ready", flush=True)
    deadline = time.time() + 20
    while not got and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # a second copy of the signal would arrive now
    print(f"got {len(got)}", flush=True)
""")

PARENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from studies.jobs import run_sweep
    sys.exit(run_sweep([sys.executable, "-c", {child!r}], cwd=Path.cwd()))
""")


@pytest.mark.parametrize("to_group", [True, False], ids=["terminal-ctrl-c", "kill-the-protocol"])
def test_ctrl_c_reaches_the_sweep_exactly_once(tmp_path, to_group):
    """A terminal's Ctrl-C goes to the whole foreground process group. The sweep runs in its own
    session, so it gets the SIGINT once, passed on by the protocol — twice would mean 'stop now,
    without a checkpoint' to train.py. Signalling the protocol process alone works the same."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=CHILD)], stdout=subprocess.PIPE, text=True,
                              start_new_session=True)  # a stand-in for the terminal's foreground group
    assert parent.stdout.readline().strip() == "ready"
    if to_group:
        os.killpg(parent.pid, signal.SIGINT)
    else:
        parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) == 128 + signal.SIGINT  # stopped on request
    assert parent.stdout.read().strip() == "got 1"  # the sweep saw the SIGINT exactly once


def test_a_signal_death_is_reported_as_128_plus_the_signal(tmp_path):
    assert run_sweep([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"],
                     cwd=tmp_path) == 128 + signal.SIGTERM


def test_a_stop_request_wins_over_the_sweeps_own_exit_status(tmp_path):
    """A Ctrl-C that lands between two jobs makes Hydra exit 1 (KeyboardInterrupt), not 130: the
    protocol still reports it as stopped, so it prints how to continue instead of an error."""
    child = ("import signal, sys, time; signal.signal(signal.SIGINT, lambda *a: sys.exit(1)); "
             "print('ready', flush=True); time.sleep(20)")
    parent = subprocess.Popen([sys.executable, "-c", PARENT.format(child=child)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "ready"
    parent.send_signal(signal.SIGINT)
    assert parent.wait(timeout=30) == 128 + signal.SIGINT


def test_cpu_lock_excludes_other_holders_and_waits_for_them(tmp_path):
    lock = tmp_path / "cpu.lock"
    with open(lock, "a") as other:
        fcntl.flock(other, fcntl.LOCK_EX)  # someone else's job holds the machine
        entered = threading.Event()

        def job():
            with contextlib.redirect_stdout(io.StringIO()), cpu_lock(lock):
                entered.set()
                time.sleep(0.2)

        worker = threading.Thread(target=job)
        worker.start()
        assert not entered.wait(0.5)  # our run waits while the other job runs
        fcntl.flock(other, fcntl.LOCK_UN)
        assert entered.wait(5)
        with pytest.raises(BlockingIOError):  # and holds the lock while it runs
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        worker.join()
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when it is done
