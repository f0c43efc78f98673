"""Batches from a memory-mapped token file: training windows — drawn at random, or every window once per
epoch (data.sampling, SAMPLERS) — and fixed evaluation windows."""

from typing import TYPE_CHECKING, Dict, Tuple

import numpy as np

from data.sources import DataError

if TYPE_CHECKING:  # torch is imported where a batch is made: preparing data never loads it
    import torch

# Mixed into each epoch's seed so its order is a stream of its own, never one of the random sampler's
# [seed, step, micro_step] draws ("EPOC" in ASCII).
EPOCH_STREAM = 0x45504F43


def _check_length(tokens: np.ndarray, seq_len: int, split: str) -> None:
    # A window holds seq_len inputs plus one more token for the last target; the strict `>`
    # leaves at least two start offsets, so sampling is never a constant.
    if seq_len < 1:
        raise DataError(f"seq_len={seq_len} must be at least 1")
    if len(tokens) <= seq_len + 1:
        raise DataError(
            f"the {split} split has {len(tokens)} tokens, not more than seq_len+1={seq_len + 1}; "
            "use a shorter sequence length or more data (data.val_fraction for validation)"
        )


def windows_per_epoch(num_tokens: int, seq_len: int) -> int:
    """How many windows one epoch of EpochBatches holds: the non-overlapping windows that fit at EVERY start
    offset in [0, seq_len), so each epoch has the same length whatever its offset. A window spans seq_len + 1
    tokens, so at offset seq_len - 1 window i needs seq_len - 1 + i*seq_len + seq_len + 1 <= num_tokens.
    At least 1: a split shorter than two windows still has one (its offsets then narrow to what fits)."""
    return max((num_tokens - seq_len) // seq_len, 1)


class _TrainWindows:
    """What both samplers share: the checks and the gather. Each sampler says where its windows start:
    `_starts(step, micro_step)`, this rank's (micro_batch_size,) starts."""

    def __init__(
        self,
        tokens: np.ndarray,
        seq_len: int,
        micro_batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        grad_accum_steps: int = 1,
    ):
        _check_length(tokens, seq_len, "train")
        if micro_batch_size < 1 or not 0 <= rank < world_size:
            raise DataError(
                f"need micro_batch_size >= 1 and 0 <= rank < world_size, got {micro_batch_size}, {rank}, {world_size}"
            )
        if grad_accum_steps < 1:
            raise DataError(f"grad_accum_steps={grad_accum_steps} must be at least 1")
        if seed < 0:
            raise DataError(f"seed={seed} must be non-negative")
        self.tokens, self.seq_len, self.micro_batch_size = tokens, seq_len, micro_batch_size
        self.seed, self.rank, self.world_size = seed, rank, world_size
        self.grad_accum_steps = grad_accum_steps
        self._window = np.arange(seq_len + 1)

    def get(self, step: int, micro_step: int = 0) -> Tuple["torch.Tensor", "torch.Tensor"]:
        """(input_ids, targets), each (micro_batch_size, seq_len) int64; targets are inputs shifted by one."""
        import torch

        starts = self._starts(step, micro_step)
        # One fancy-index gathers every window from the memmap in a single pass.
        windows = torch.from_numpy(np.asarray(self.tokens[starts[:, None] + self._window], dtype=np.int64))  # (B, T+1)
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class TrainBatches(_TrainWindows):
    """Random windows drawn with replacement (data.sampling=random). Each (seed, step, micro_step) draws one global
    batch and rank r takes rows [r*b, (r+1)*b): a resume sees the same batches, ranks never share a row, 2 ranks x b see
    what 1 rank x 2b sees, and there is no iterator state to checkpoint. One epoch's worth leaves ~37 % undrawn."""

    def _starts(self, step: int, micro_step: int) -> np.ndarray:
        # SeedSequence of the tuple: independent streams per step, no state carried between calls.
        rng = np.random.default_rng([self.seed, step, micro_step])
        global_batch = self.micro_batch_size * self.world_size
        starts = rng.integers(0, len(self.tokens) - self.seq_len, size=global_batch)
        return starts[self.rank * self.micro_batch_size : (self.rank + 1) * self.micro_batch_size]


class EpochBatches(_TrainWindows):
    """Every training window once per epoch, in a seeded order (data.sampling=epochs): still a pure function of
    (seed, step, micro_step, rank), so resume, rank disjointness and 2 x b = 1 x 2b hold as for TrainBatches. The
    run's sample n is slot n % W of epoch n // W, whose seed draws a start offset and a permutation of its W windows:
    a new offset each epoch moves the window edges, so no token is always a first input (never a target) or a last."""

    def __init__(self, *args, **kwargs):  # _TrainWindows' arguments
        super().__init__(*args, **kwargs)
        self.windows_per_epoch = windows_per_epoch(len(self.tokens), self.seq_len)
        # seq_len offsets, unless the split holds fewer than two windows: then those that fit its one window.
        self._offsets = min(self.seq_len, len(self.tokens) - self.windows_per_epoch * self.seq_len)
        self._orders: Dict[int, Tuple[int, np.ndarray]] = {}  # memo of the last two epochs' orders

    def _starts(self, step: int, micro_step: int) -> np.ndarray:
        if not 0 <= micro_step < self.grad_accum_steps:  # else two (step, micro_step) would share samples
            raise DataError(
                f"micro_step={micro_step} is outside 0..{self.grad_accum_steps - 1} "
                f"(grad_accum_steps={self.grad_accum_steps})"
            )
        global_batch = self.micro_batch_size * self.world_size
        first = (step * self.grad_accum_steps + micro_step) * global_batch + self.rank * self.micro_batch_size
        epochs, slots = np.divmod(
            np.arange(first, first + self.micro_batch_size, dtype=np.int64), self.windows_per_epoch
        )
        starts = np.empty(self.micro_batch_size, dtype=np.int64)
        for epoch in np.unique(epochs):  # usually one; two where the batch crosses an epoch's end
            offset, order = self.epoch_order(int(epoch))
            here = epochs == epoch
            starts[here] = offset + order[slots[here]] * self.seq_len
        return starts

    def epoch_order(self, epoch: int) -> Tuple[int, np.ndarray]:
        """(start offset, permutation of the window indices) of one epoch, from its seed alone. Memoised: a run
        asks for the same epoch for many steps, and a permutation of 10^6 windows takes milliseconds."""
        if epoch not in self._orders:
            rng = np.random.default_rng([self.seed, epoch, EPOCH_STREAM])
            offset = int(rng.integers(0, self._offsets))
            self._orders = {
                **{e: o for e, o in self._orders.items() if e == epoch - 1},
                epoch: (offset, rng.permutation(self.windows_per_epoch)),
            }
        return self._orders[epoch]


# data.sampling → the class that draws the training windows (DataConfig checks the name).
SAMPLERS = {"random": TrainBatches, "epochs": EpochBatches}


def eval_windows(
    tokens: np.ndarray, seq_len: int, num_windows: int, rank: int = 0, world_size: int = 1
) -> "torch.Tensor":
    """This rank's share of `num_windows` validation windows, (n, seq_len + 1) int64, spread evenly over the
    non-overlapping tiling (every target scored at most once; trainer.eval_windows=all scores every token:
    training/evaluation.py). The count is rounded DOWN to a multiple of world_size: every rank runs as many passes."""
    _check_length(tokens, seq_len, "validation")
    if not 0 <= rank < world_size:
        raise DataError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    fitting = (len(tokens) - 1) // seq_len
    count = min(max(num_windows, 1), fitting)
    count -= count % world_size
    if count == 0:
        raise DataError(
            f"the validation split holds {fitting} windows of seq_len={seq_len}, fewer than world_size={world_size}; "
            "use a shorter sequence length or more validation data"
        )
    tiles = np.arange(count) * fitting // count  # evenly spaced, distinct, increasing
    starts = tiles[rank::world_size] * seq_len
    import torch

    return torch.from_numpy(np.asarray(tokens[starts[:, None] + np.arange(seq_len + 1)], dtype=np.int64))
