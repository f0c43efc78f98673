"""Graceful stop: SIGINT/SIGTERM ask the training loop to checkpoint and exit at a step boundary."""
import signal


class StopFlag:
    def __init__(self):
        self.signal = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

    def _handle(self, signum, frame):
        if self.signal is not None:  # a second Ctrl-C means "now", not "after the checkpoint"
            raise KeyboardInterrupt
        self.signal = signal.Signals(signum).name

    def restore(self) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
