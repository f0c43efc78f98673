"""tests/conftest.py: under `make test`'s two workers, the tests that train stay on one worker (one at a
time) and every worker computes on one thread."""
import os

import pytest
import torch


def under_make_test(config) -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER")) and getattr(config.option, "loadgroup", False)


@pytest.mark.serial
def test_a_serial_test_carries_the_group_the_scheduler_reads(request):
    """xdist's loadgroup scheduler sees only node ids: a `serial` test must end in `@serial`, or the tests
    that train spread over both workers and run two at a time. pytest 9.2 drops the suffix without a word
    (pytest-dev/pytest-xdist#1386): this is the test that says so."""
    if not under_make_test(request.config):
        pytest.skip("checks make test's workers: run with `make test` (pytest -n 2 --dist loadgroup)")
    assert request.node.nodeid.endswith("::test_a_serial_test_carries_the_group_the_scheduler_reads@serial")


def test_other_tests_are_not_grouped_and_workers_use_one_thread(request):
    if not under_make_test(request.config):
        pytest.skip("checks make test's workers: run with `make test` (pytest -n 2 --dist loadgroup)")
    assert "@" not in request.node.nodeid
    assert torch.get_num_threads() == 1  # two workers × one thread: the 2 cores, not oversubscribed
