"""The developers' tools: the benchmarks behind BENCHMARKS.md (`python -m dev.bench NAME`) and mutation testing
(dev/mutation.sh, scored by `python -m dev.mutation_score`). They import the framework; it never imports them."""
