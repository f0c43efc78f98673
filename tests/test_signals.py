"""training/distributed.py: the loop's stop flag, and a survivor that outlives torchrun's SIGTERM long enough
to print its one line (docs/reliability.md, the killed rank)."""

import os
import signal

from training.distributed import StopFlag


def test_the_flag_records_the_first_signal_and_restores_the_handlers_once():
    before = signal.getsignal(signal.SIGTERM)
    try:
        stop = StopFlag()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.signum == signal.SIGTERM
        stop.restore()
        assert signal.getsignal(signal.SIGTERM) is before
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stop.restore()  # a second call (the loop's finally after peer_lost) changes nothing
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, before)


def test_after_a_lost_peer_torchruns_sigterm_cannot_kill_the_rank_before_its_error_line():
    """torchrun SIGTERMs the survivor of a killed rank; landing after the loop restored the default handler, it
    killed rank 0 before its `error:` line (exit −15, seen once in a suite run). peer_lost ignores SIGTERM, and the
    loop's restore() in its finally does not undo that."""
    before_term, before_int = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        stop = StopFlag()
        stop.peer_lost()
        stop.restore()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGINT) is before_int  # Ctrl-C still interrupts
        os.kill(os.getpid(), signal.SIGTERM)  # survives
    finally:
        signal.signal(signal.SIGTERM, before_term)
