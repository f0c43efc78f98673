"""Shared data fixtures: one prepared Shakespeare cache per session, and small synthetic corpora."""
import pytest

from data import DataConfig, prepare
from tests.data_helpers import QUIET, make_documents


@pytest.fixture(scope="session")
def shakespeare(tmp_path_factory):
    """The default data config, prepared once (cold) into a session temp cache: a few seconds."""
    return prepare(DataConfig(cache_dir=str(tmp_path_factory.mktemp("shakespeare_cache"))), **QUIET)


@pytest.fixture
def documents():
    return make_documents(200)
