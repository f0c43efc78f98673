"""Training: the typed config, the command line's edge, the loop and its parts; how a program's error line and signal
look. Importing it first checks TORCHINDUCTOR_CACHE_DIR, before anything imports torch._dynamo, which creates it."""

import os
import signal
from typing import Optional


def one_line(error: BaseException, limit: Optional[int] = None, typed: bool = False) -> str:
    """An error's message as one line (its first, cut at `limit`), or its type's name; `typed` puts the type first."""
    error = getattr(error, "inner_exception", None) or error  # torch's BackendCompilerFailed names only the backend
    text = str(error).strip()
    line = (text.splitlines()[0] if text else type(error).__name__)[:limit]
    return f"{type(error).__name__}: {line}" if typed and text else line


class Interrupted(KeyboardInterrupt):
    """SIGTERM raised as Ctrl-C is: `finally` blocks run (a half-built cache is removed), then one line and 143."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def inductor_cache_problem() -> Optional[str]:
    """Why TORCHINDUCTOR_CACHE_DIR cannot hold inductor's code, in one line (importing torch._dynamo creates it: a
    file there, or a folder the user cannot write, was a traceback from inside torch); None when it can or is unset."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
        usable, why = os.access(folder, os.W_OK | os.X_OK), "it is not writable"
    except OSError as e:
        usable, why = False, (e.strerror or str(e)).lower()
    if usable:
        return None
    return f"TORCHINDUCTOR_CACHE_DIR={folder} cannot hold torch.compile's cache ({why}); point it at a folder you can write, or unset it"


if (_problem := inductor_cache_problem()) is not None:  # before any program imports the model
    raise SystemExit(f"error: {_problem}")
