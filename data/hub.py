"""Load a dataset with `datasets.load_dataset`: a hub id, or a local folder laid out like one.

The hub is checked with a 2-second socket probe first: unreachable, `datasets` would spend
~23 s in retries before failing with a message that doesn't say what to do instead.
"""
import contextlib
import os
import socket
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional
from urllib.parse import urlparse

from data.errors import DataError

OFFLINE_CHOICES = "offline choices: data=shakespeare, or data=local data.path=<your files>"


def hub_reachable(timeout: float = 2.0) -> bool:
    """Whether a TCP connection to the hub endpoint opens within `timeout` seconds."""
    import datasets

    url = urlparse(datasets.config.HF_ENDPOINT)
    try:
        with socket.create_connection((url.hostname, url.port or 443), timeout=timeout):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def _offline_mode() -> Iterator[None]:
    """Make `datasets` answer from its local cache at once instead of retrying the network.

    Both libraries read these flags at import time (from HF_HUB_OFFLINE), so this flips the
    module attributes they consult on each call, and restores them afterwards.
    """
    import datasets
    import huggingface_hub.constants as hub_constants

    saved = datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE, hub_constants.HF_HUB_OFFLINE = saved


def load_hub_dataset(
    path: str,
    name: Optional[str] = None,
    data_files: Optional[List[str]] = None,
    streaming: bool = False,
    cache_dir: Optional[str] = None,
    builder_options: Optional[Dict[str, Any]] = None,
):
    """All splits of `path` as a DatasetDict (IterableDatasetDict when streaming).

    A local folder goes through the very same call, which is how tests exercise this path.
    `builder_options` go to the builder's config, e.g. {"sample_by": "paragraph"} for text files.
    """
    import datasets

    remote = not os.path.exists(path)
    offline = remote and not datasets.config.HF_HUB_OFFLINE and not hub_reachable()
    guard = _offline_mode() if offline else contextlib.nullcontext()
    try:
        with guard:
            return datasets.load_dataset(
                path, name=name, data_files=data_files or None, streaming=streaming, cache_dir=cache_dir,
                **(builder_options or {}),
            )
    except ConnectionError:
        raise DataError(f"cannot reach the Hugging Face hub for '{path}' and it is not in the local cache; {OFFLINE_CHOICES}") from None
    except ValueError as error:
        if "BuilderConfig" in str(error):  # unknown config name
            raise DataError(f"'{path}' has no config data.name={name!r} ({_first_line(error)}); "
                            "fix data.name or use data.data_files") from None
        raise DataError(f"cannot load '{path}': {_first_line(error)}; check data.path and data.name") from None
    except FileNotFoundError as error:
        where = "folder" if Path(path).is_dir() else "dataset"
        raise DataError(f"no data files in {where} '{path}' ({_first_line(error)}); check data.path / data.data_files") from None
    except datasets.exceptions.DatasetsError as error:  # e.g. a malformed json or parquet file
        cause = error.__cause__ or error
        raise DataError(f"cannot read '{path}': {_first_line(cause)}; fix or remove the file") from None


def _first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
