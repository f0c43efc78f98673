"""The token cache on disk: a directory per (source, tokenizer) key, published by one atomic rename."""
import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

# Bump when the cleaning, the tokenization, the split rule or the file layout changes: old caches
# then miss. 2: several local text files hold out whole files; text folders honour data.sample_by.
CACHE_VERSION = 2
META_FILE = "meta.json"


def cache_key(identity: Dict[str, Any]) -> str:
    """12 hex digits of a hash over everything that decides the tokens."""
    blob = json.dumps({"cache_version": CACHE_VERSION, **identity}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:12]


def read_meta(directory: Path) -> Optional[Dict[str, Any]]:
    """The meta.json of a complete cache, or None. A directory only ever exists complete: see `publish`."""
    try:
        return json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def write_json(path: Path, content: Dict[str, Any]) -> None:
    path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n", encoding="utf-8")


@contextlib.contextmanager
def publish(final: Path) -> Iterator[Path]:
    """Yield a private temp directory; on success rename it to `final`, on any failure delete it.

    A killed process leaves only `<final>.tmp-<pid>`, which never looks like a cache. Ranks that
    build the same key concurrently each finish their own copy; the first rename wins and the
    others discard theirs (the contents are identical).
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(final)
    temp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(temp, ignore_errors=True)
    temp.mkdir()
    try:
        yield temp
        try:
            os.replace(temp, final)
        except OSError:
            if read_meta(final) is None:  # not a lost race: a real failure
                raise
    finally:
        shutil.rmtree(temp, ignore_errors=True)


def _remove_abandoned(final: Path) -> None:
    """Delete temp directories of this key left by processes that no longer run (on this host)."""
    for temp in final.parent.glob(f"{final.name}.tmp-*"):
        pid = temp.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(temp, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
