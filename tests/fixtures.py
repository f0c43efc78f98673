"""The suite's shared fixtures (conftest.py loads them for tests/, lab/tests and dev/tests): prepared caches once per
session (Shakespeare for the default config and for `debug=tiny`), small corpora; how `make test` shares 2 cores."""

import os
from pathlib import Path

import pytest

from data import DataConfig, prepare
from tests.data_helpers import QUIET, make_documents


@pytest.fixture(scope="session")
def shakespeare(tmp_path_factory):
    """The default data config, prepared once (cold) into a session temp cache: a few seconds."""
    return prepare(DataConfig(cache_dir=str(tmp_path_factory.mktemp("shakespeare_cache"))), **QUIET)


@pytest.fixture(scope="session")
def tiny_data_cache(tmp_path_factory):
    """A data.cache_dir that already holds what `train.py debug=tiny` reads (Shakespeare, 512-token BPE):
    train.py runs pointed at it (in process or not) start without tokenizing, ~5 s saved per module.
    MINILLAMA_TEST_DATA_CACHE names a folder to keep it in across sessions instead: dev/mutation.sh
    sets it, as each mutant is a pytest session of its own that would tokenize Shakespeare again (~7 s)."""
    from tests.train_helpers import compose_train_config

    kept = os.environ.get("MINILLAMA_TEST_DATA_CACHE")
    cache_dir = Path(kept) if kept else tmp_path_factory.mktemp("tiny_data_cache")
    cfg, _ = compose_train_config(["debug=tiny", f"data.cache_dir={cache_dir}"])
    prepare(cfg.data, seq_len=cfg.trainer.seq_len, model_vocab_size=cfg.model.vocab_size, **QUIET)
    return cache_dir


@pytest.fixture
def documents():
    return make_documents(200)


@pytest.fixture
def exact_fp32():
    """TF32 off for the test, the global switches restored after it: fp32 comparisons need real fp32
    matmuls (the training loop turns TF32 on), and tests that flip the switches must not leak them.
    (torch's flag objects are not plain attributes: no monkeypatch.)"""
    import torch

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


# ---- two workers (make test: pytest -n 2 --dist loadgroup) ---------------------------------------------
# Tests marked `serial` (they start train.py, torchrun, a sweep or a benchmark) all go to one worker, so
# they run one at a time as on one core; the other worker takes everything else. Each worker computes
# on one thread: two workers × one thread fill 2 cores without oversubscribing them.


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("serial") is not None:
            item.add_marker(pytest.mark.xdist_group("serial"))


def pytest_configure(config):
    # Tests that call torch.compile themselves (test_attention, test_hybrid_attention, test_loss, test_compile) keep
    # inductor's cache per CPU capability as every program does (training/compile.py): a suite run under
    # ATEN_CPU_CAPABILITY=avx2 was served graphs compiled natively and died of a segfault in one.
    from training.loop import cache_for_this_cpu

    cache_for_this_cpu()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
