"""training/log.py's Throughput: an interval's training seconds are its wall time minus the pauses (evaluations,
checkpoints) and minus compiling — compiling inside a pause counted once, not twice."""

from types import SimpleNamespace

import training.log as log
from training.log import Throughput


def test_compiling_inside_an_evaluation_is_taken_off_the_interval_once(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(log, "clock", lambda: now[0])
    loss = SimpleNamespace(compile_seconds=0.0)
    clock = Throughput(loss)
    now[0] += 10.0  # 10 s of training steps
    loss.compile_seconds += 2.0  # of which 2 s compiled the training graph
    clock.steps = 10
    with clock.paused("eval"):
        now[0] += 5.0  # a 5 s evaluation ...
        loss.compile_seconds += 4.0  # ... 4 s of it compiling the evaluation's graph
    now[0] += 3.0  # 3 s more of training
    assert clock.lap() == (10, 11.0)  # 18 s of wall time − 5 s paused − 2 s compiled outside the pause
    assert clock.paused_by_kind == {"eval": (5.0, 1)}  # the pause's cost still includes its compile
    now[0] += 4.0
    clock.steps = 4
    assert clock.lap() == (4, 4.0)  # the next interval starts clean
