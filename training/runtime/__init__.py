"""The process and the machine: device, ranks and their agreed decisions, signals, the run directory, memory and peak FLOP/s."""
