"""Batches from a memory-mapped token file: random training windows and fixed evaluation windows."""
from typing import Tuple

import numpy as np
import torch

from data.errors import DataError


def _check_length(tokens: np.ndarray, seq_len: int, split: str) -> None:
    # A window holds seq_len inputs plus one more token for the last target; the strict `>`
    # leaves at least two start offsets, so sampling is never a constant.
    if seq_len < 1:
        raise DataError(f"seq_len={seq_len} must be at least 1")
    if len(tokens) <= seq_len + 1:
        raise DataError(f"the {split} split has {len(tokens)} tokens, not more than seq_len+1={seq_len + 1}; "
                        "use a shorter sequence length or more data (data.val_fraction for validation)")


class TrainBatches:
    """Random `(input_ids, targets)` windows, a pure function of (seed, step, micro_step, rank).

    Each (seed, step, micro_step) draws one global batch of `micro_batch_size * world_size`
    window starts and rank r takes rows [r*b, (r+1)*b). So a resumed run sees exactly the batches
    it would have seen, ranks never share a row, and 2 ranks x batch b see the same data as
    1 rank x batch 2b. No iterator state exists to checkpoint.
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, micro_batch_size: int, seed: int,
                 rank: int = 0, world_size: int = 1):
        _check_length(tokens, seq_len, "train")
        if micro_batch_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"need micro_batch_size >= 1 and 0 <= rank < world_size, got {micro_batch_size}, {rank}, {world_size}")
        if seed < 0:
            raise DataError(f"seed={seed} must be non-negative")
        self.tokens, self.seq_len, self.micro_batch_size = tokens, seq_len, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self._window = np.arange(seq_len + 1)

    def get(self, step: int, micro_step: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, targets), each (micro_batch_size, seq_len) int64; targets are inputs shifted by one."""
        # SeedSequence of the tuple: independent streams per step, no state carried between calls.
        rng = np.random.default_rng([self.seed, step, micro_step])
        global_batch = self.micro_batch_size * self.world_size
        starts = rng.integers(0, len(self.tokens) - self.seq_len, size=global_batch)
        mine = starts[self.rank * self.micro_batch_size:(self.rank + 1) * self.micro_batch_size]
        # One fancy-index gathers every window from the memmap in a single pass.
        windows = torch.from_numpy(np.asarray(self.tokens[mine[:, None] + self._window], dtype=np.int64))  # (B, T+1)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def eval_windows(tokens: np.ndarray, seq_len: int, num_windows: int, rank: int = 0,
                 world_size: int = 1) -> torch.Tensor:
    """This rank's share of a fixed set of validation windows, (n, seq_len + 1) int64.

    The set is `num_windows` windows spread evenly over the split, chosen among the
    non-overlapping tiling (window i starts at i * seq_len, so consecutive ones share one token
    and every target is scored at most once). Even the whole tiling misses the split's first
    token and its ragged tail: `training.evaluation.full_split_windows` (trainer.eval_windows=all)
    scores every token exactly once. The count is capped by what fits and then rounded DOWN
    to a multiple of world_size, so every rank runs the same number of forward passes; rank r
    takes windows r, r + world_size, ... and the ranks together cover the set exactly.
    Callers split each row into inputs `w[:, :-1]` and targets `w[:, 1:]`.
    """
    _check_length(tokens, seq_len, "validation")
    if not 0 <= rank < world_size:
        raise DataError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    fitting = (len(tokens) - 1) // seq_len
    count = min(max(num_windows, 1), fitting)
    count -= count % world_size
    if count == 0:
        raise DataError(f"the validation split holds {fitting} windows of seq_len={seq_len}, fewer than world_size={world_size}; "
                        "use a shorter sequence length or more validation data")
    tiles = np.arange(count) * fitting // count  # evenly spaced, distinct, increasing
    starts = tiles[rank::world_size] * seq_len
    return torch.from_numpy(np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int64))
