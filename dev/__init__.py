"""The developers' tools, kept out of the user programs' folder (cli/): the benchmarks behind python -m dev.bench NAME
(bench/) and the mutation score behind dev/mutation_score.py. They may import everything; nothing but a
script or a test imports them."""
