"""tests/fixtures.py: under `make test`'s two workers, the tests that train stay on one worker (one at a
time) and every worker computes on one thread. Run any other way (plain pytest, one file), this file runs
itself under two workers in a child pytest, so the checks never skip."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def under_make_test(config) -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and getattr(config.option, "loadgroup", False)


@pytest.fixture(scope="module")
def checked_in_workers(request):
    """None under make test's workers (check here); else the output of this file run under two workers."""
    if under_make_test(request.config):
        return None
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-n",
            "2",
            "--dist",
            "loadgroup",
            "-p",
            "no:cacheprovider",
            __file__,
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.serial
def test_a_serial_test_carries_the_group_the_scheduler_reads(request, checked_in_workers):
    """xdist's loadgroup scheduler sees only node ids: a `serial` test must end in `@serial`, or the tests
    that train spread over both workers and run two at a time. pytest 9.2 drops the suffix without a word
    (pytest-dev/pytest-xdist#1386): this is the test that says so."""
    if checked_in_workers is not None:
        assert "2 passed" in checked_in_workers and "skipped" not in checked_in_workers, checked_in_workers
        return
    assert request.node.nodeid.endswith("::test_a_serial_test_carries_the_group_the_scheduler_reads@serial")


def test_other_tests_are_not_grouped_and_workers_use_one_thread(request, checked_in_workers):
    if checked_in_workers is not None:
        assert "2 passed" in checked_in_workers, checked_in_workers
        return
    assert "@" not in request.node.nodeid
    assert torch.get_num_threads() == 1  # two workers × one thread: the 2 cores, not oversubscribed
