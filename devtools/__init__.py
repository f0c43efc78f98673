"""The developers' tools, kept out of the user programs' folder (cli/): the benchmarks behind scripts/bench_*.py
(bench/) and the mutation score behind scripts/mutation_score.py. They may import everything; nothing but a
script or a test imports them."""
