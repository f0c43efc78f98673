"""The edge: Hydra config → typed config (config.py), and the programs behind scripts/ — one module each, its
arguments and orchestration — with what they share: one `error:` line and an exit status for every failure."""

import os
import signal
import sys
from pathlib import Path
from typing import Callable, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]  # configs/, train.py and BENCHMARKS.md live here
USER_ERRORS = (ValueError, OSError)  # DataError, CheckpointError, ConfigError, … are ValueErrors


def one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class Interrupted(KeyboardInterrupt):
    """SIGTERM raised as Ctrl-C is: `finally` blocks run (a half-built cache is removed), then one line and 143."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def sigterm_interrupts() -> None:
    """From here on SIGTERM interrupts like Ctrl-C (the default would kill at once: no line, scratch left)."""

    def handle(signum, frame):
        raise Interrupted(signum)

    signal.signal(signal.SIGTERM, handle)


def exit_status(
    main: Callable, argv: Optional[Sequence[str]] = None, also: tuple = (), interrupted: Optional[str] = None
) -> int:
    """main(argv)'s status: a user's error is one `error: …` line and 1; Ctrl-C is 130 and SIGTERM 143, each with
    one line (`interrupted`, or the signal's name)."""
    try:
        return main(argv) or 0
    except (*USER_ERRORS, *also) as e:
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as e:
        signum = getattr(e, "signum", signal.SIGINT)
        print(
            interrupted or f"\n{signal.Signals(signum).name}: interrupted",
            file=sys.stderr,
        )
        return 128 + int(signum)


def run(main: Callable, also: tuple = (), interrupted: Optional[str] = None) -> None:
    """A script's whole body: exit with main's status on the command line's arguments."""
    sigterm_interrupts()
    sys.exit(exit_status(main, None, also, interrupted))


def read_utf8(path, flag: str) -> str:
    """A text file's content; one line naming the file when it is not UTF-8 (or cannot be read)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{flag} {path} is not UTF-8 text ({e.reason} at byte {e.start}); convert it to UTF-8"
        ) from None
    except OSError as e:
        raise ValueError(f"{flag} {path}: {e.strerror.lower() if e.strerror else e}") from None


def description(doc: str) -> str:
    """A program's --help text: its docstring's first paragraph, on one line."""
    return " ".join(doc.strip().split("\n\n")[0].split())


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
    return (
        None
        if usable
        else (
            f"TORCHINDUCTOR_CACHE_DIR={folder} cannot hold torch.compile's cache ({why}); point it "
            "at a folder you can write, or unset it"
        )
    )


if (_problem := inductor_cache_problem()) is not None:  # before any program imports the model
    raise SystemExit(f"error: {_problem}")
