"""The benchmarks behind scripts/bench_*.py: each times one part side by side in one process and
prints (or with --write, records in BENCHMARKS.md) a markdown table."""
