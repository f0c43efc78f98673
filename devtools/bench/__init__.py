"""The benchmarks behind scripts/bench_*.py: each times one part side by side in one process and
prints (or with --write, records in BENCHMARKS.md) a markdown table."""
import time


def timed(fn) -> float:
    """Seconds one call of fn takes (wall clock): the benchmarks' one stopwatch."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0
