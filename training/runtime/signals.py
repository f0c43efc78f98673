"""Graceful stop: SIGINT/SIGTERM ask the loop to checkpoint and exit at a step boundary; a second one stops now.

Exit statuses follow the shell convention 128 + signal number — 130 for Ctrl-C (SIGINT), 143 for
SIGTERM — so make, shells and schedulers can tell "interrupted (checkpoint saved)" from "finished" (0).
"""
import signal
from typing import Optional


class StoppedNow(KeyboardInterrupt):
    """A second signal: leave at once, without a checkpoint. A KeyboardInterrupt, so no `except
    Exception` on the way up swallows it; train.py turns it into one line and exit 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopFlag:
    """Records the first SIGINT/SIGTERM; the loop reads it at step boundaries (agreed across ranks)."""

    def __init__(self):
        self.signum: Optional[int] = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.signum is not None:  # a second Ctrl-C means "now", not "after the checkpoint"
            raise StoppedNow(signum)
        self.signum = signum

    def restore(self) -> None:
        """The handlers from before, once (a second call changes nothing)."""
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous = {}

    def peer_lost(self) -> None:
        """Another rank died: torchrun will SIGTERM this one, and a SIGTERM landing between restore() and the
        `error:` line killed it silently (exit −15). From here SIGTERM is ignored; the process is ending with status 1."""
        self.restore()
        signal.signal(signal.SIGTERM, signal.SIG_IGN)


def exit_status(signum: int) -> int:
    return 128 + int(signum)


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name
