"""lab/sweep.py's cost: seconds per run from measured throughput; lab/ablation/runner.py: the cost table's arithmetic."""

import pytest

from analysis.runs import Run
from lab import sweep
from lab.ablation import runner


def run_with_rates(rates) -> Run:
    return Run(path=None, config={}, evals=[], trains=[{"step": i, "tokens_per_s": r} for i, r in enumerate(rates)])


def test_run_seconds_scales_the_measured_rate_to_the_budget():
    budget = sweep.Budget(max_steps=100, tokens_per_step=2048, eval_interval=25, eval_tokens=8192)
    runs = [
        run_with_rates([1.0, 2048.0, 2048.0, 2048.0]),
        run_with_rates([1.0, 4096.0, 4096.0, 4096.0]),
        run_with_rates([1.0, 1024.0, 1024.0, 1024.0]),
    ]  # median throughput: 2048 tokens/s
    expected = 100 * 1.0 + 4 * 8192 * sweep.EVAL_COST / 2048 + sweep.JOB_OVERHEAD_S
    assert sweep.run_seconds(budget, runs) == pytest.approx(expected)
    assert sweep.run_seconds(budget, [run_with_rates([])]) is None


def test_evals_cost_what_the_runs_measured():
    run = Run(
        path=None,
        config={},
        trains=[{"step": s, "time": 100.0 + s, "tokens_per_s": 2048.0} for s in (1, 2, 3, 4)],
        evals=[{"step": 2, "time": 104.5}, {"step": 4, "time": 106.5}],
    )  # 2.5 s after each logged step
    assert sweep.eval_seconds(run) == 2.5
    budget = sweep.Budget(max_steps=100, tokens_per_step=2048, eval_interval=25, eval_tokens=8192)
    assert sweep.run_seconds(budget, [run]) == pytest.approx(100.0 + 4 * 2.5 + sweep.JOB_OVERHEAD_S)
    assert sweep.eval_seconds(Run(path=None, config={}, trains=[], evals=[{"step": 2, "time": 1.0}])) is None


def test_table_totals():
    lines = [runner.Line("h96", 540_000, 20.0, stage1=18, stage2=24), runner.Line("h192", 1_970_000, 50.0, 18, 24)]
    text = runner.table(lines, "a 10-step timing run", done=0)
    total = (20.0 * 42 + 50.0 * 42 + 2 * runner.SWEEP_STARTUP_S) / 60
    assert text.splitlines()[-2].split()[-2:] == [f"{total:.1f}", "min"]
    assert "84 runs to do (0 already finished or diverged)" in text and "0.54M" in text
    assert "?" in runner.table([runner.Line("h96", 1, None, 3, 3)], "nothing", 0).splitlines()[-2]
