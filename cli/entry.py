"""What every program behind scripts/ shares: its exit status from one wrapper (a user's error is one
`error: …` line and exit status 1, Ctrl-C exit status 130), the one-line text of an error, and reading
a user's text file with an error that names it; and the environment variable that would break torch's import,
refused in one line before any program starts (inductor_cache_problem, checked when cli/ is imported)."""
import os
import sys
from typing import Callable, Optional, Sequence

USER_ERRORS = (ValueError, OSError)  # DataError, CheckpointError, ConfigError, … are ValueErrors


def one_line(error: BaseException) -> str:
    """The first line of an error's message, or its class name when it has none."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def exit_status(main: Callable, argv: Optional[Sequence[str]] = None, also: tuple = (),
                interrupted: Optional[str] = None) -> int:
    """main(argv)'s exit status (None counts as 0). A user's error (USER_ERRORS, and `also`) is one
    `error: …` line on stderr and 1; Ctrl-C is 130, after the `interrupted` line if one is given."""
    try:
        return main(argv) or 0
    except (*USER_ERRORS, *also) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if interrupted:
            print(interrupted, file=sys.stderr)
        return 130


def run(main: Callable, also: tuple = (), interrupted: Optional[str] = None) -> None:
    """A script's whole body: `run(main)` exits with main's status on the command line's arguments."""
    sys.exit(exit_status(main, None, also, interrupted))


def read_utf8(path, flag: str) -> str:
    """A text file's content; one line naming the file when it is not UTF-8 (or cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8") from None
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror.lower() if e.strerror else e}") from None


def description(doc: str) -> str:
    """A program's `--help` description: its docstring's first paragraph, on one line (its first line alone
    stopped mid-sentence wherever the paragraph wrapped)."""
    return " ".join(doc.strip().split("\n\n")[0].split())


def inductor_cache_problem() -> Optional[str]:
    """Why TORCHINDUCTOR_CACHE_DIR cannot hold inductor's compiled code, as one line; None when it can or is unset.
    Creates the folder when missing, as torch would. Importing torch._dynamo (the model does, for one eager
    function) creates that folder: a file there, a path under a file or a folder the user cannot write was a
    traceback from inside torch. cli/__init__.py calls this first, so every program refuses it in one line."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        return None
    try:
        os.makedirs(folder, exist_ok=True)
        usable = os.access(folder, os.W_OK | os.X_OK)
        why = "it is not writable"
    except OSError as e:
        usable, why = False, (e.strerror or str(e)).lower()
    if usable:
        return None
    return (f"TORCHINDUCTOR_CACHE_DIR={folder} cannot hold torch.compile's cache ({why}); "
            "point it at a folder you can write, or unset it")
