"""TrainBatches, EpochBatches and eval_windows: shift-by-one, determinism from (seed, step), rank disjointness,
every window once per epoch (data.sampling=epochs), fixed eval set."""

import numpy as np
import pytest
import torch

from data import SAMPLERS, DataConfig, DataError, EpochBatches, TrainBatches, eval_windows, windows_per_epoch

# Token i is i (mod 2**16): a window's first input is its start offset, and shifts are visible.
TOKENS = np.arange(200_000, dtype=np.int64).astype(np.uint16)


def starts(inputs: torch.Tensor) -> set:
    return set(inputs[:, 0].tolist())


def test_shapes_dtype_and_shift_by_one():
    inputs, targets = TrainBatches(TOKENS, seq_len=32, micro_batch_size=8, seed=0).get(step=5)
    assert inputs.shape == targets.shape == (8, 32)
    assert inputs.dtype == targets.dtype == torch.int64 and inputs.is_contiguous() and targets.is_contiguous()
    assert torch.equal(targets[:, :-1], inputs[:, 1:])
    for row_inputs, row_targets in zip(inputs, targets):
        start = int(row_inputs[0])
        assert torch.equal(row_inputs, torch.from_numpy(TOKENS[start : start + 32].astype(np.int64)))
        assert torch.equal(row_targets, torch.from_numpy(TOKENS[start + 1 : start + 33].astype(np.int64)))


def test_every_offset_stays_inside_the_tokens():
    tokens = np.arange(40, dtype=np.uint16)  # 40 tokens, windows of 33: starts 0..7
    batches = TrainBatches(tokens, seq_len=32, micro_batch_size=64, seed=0)
    seen = set()
    for step in range(10):
        inputs, targets = batches.get(step)
        seen |= starts(inputs)
        assert int(targets.max()) <= 39
    assert seen == set(range(8))


def test_same_step_same_batch_and_resume_is_exact():
    a = TrainBatches(TOKENS, seq_len=16, micro_batch_size=4, seed=3)
    b = TrainBatches(TOKENS, seq_len=16, micro_batch_size=4, seed=3)  # a "resumed" run: a fresh object
    for step in (0, 1, 1000):
        for micro in (0, 1):
            assert torch.equal(a.get(step, micro)[0], b.get(step, micro)[0])
    assert not torch.equal(a.get(0)[0], a.get(1)[0])
    assert not torch.equal(a.get(0, 0)[0], a.get(0, 1)[0])
    assert not torch.equal(a.get(0)[0], TrainBatches(TOKENS, 16, 4, seed=4).get(0)[0])


def test_ranks_see_different_windows():
    tokens = np.arange(10_000_000, dtype=np.int32)  # distinct values: a start offset identifies a window
    ranks = [TrainBatches(tokens, 16, 8, seed=0, rank=r, world_size=4) for r in range(4)]
    for step in range(20):
        seen = [starts(batches.get(step)[0]) for batches in ranks]
        for i in range(4):
            for j in range(i + 1, 4):
                assert not seen[i] & seen[j]


def test_two_ranks_see_what_one_rank_with_twice_the_batch_sees():
    single = TrainBatches(TOKENS, 16, micro_batch_size=6, seed=1)
    pair = [TrainBatches(TOKENS, 16, micro_batch_size=3, seed=1, rank=r, world_size=2) for r in range(2)]
    for step in range(5):
        whole = single.get(step, micro_step=2)
        parts = [batches.get(step, micro_step=2) for batches in pair]
        assert torch.equal(whole[0], torch.cat([p[0] for p in parts]))
        assert torch.equal(whole[1], torch.cat([p[1] for p in parts]))


class RecordingTokens:
    """A token array that records every read: how many reads, and how many tokens each one returns."""

    def __init__(self, tokens):
        self.tokens, self.reads = tokens, []

    def __len__(self):
        return len(self.tokens)

    def __getitem__(self, index):
        out = self.tokens[index]
        self.reads.append(np.size(out))
        return out


def test_a_batch_reads_only_its_windows_from_the_memmap_in_one_read(tmp_path):
    """The file is never loaded whole: one fancy-index read per batch, of exactly B·(T+1) tokens,
    and the batch equals one cut from the same tokens in memory."""
    path = tmp_path / "train.bin"
    tokens = np.random.default_rng(0).integers(0, 4096, 2_000_000, dtype=np.uint16)
    tokens.tofile(path)
    recorded = RecordingTokens(np.memmap(path, dtype=np.uint16, mode="r"))
    from_file = TrainBatches(recorded, seq_len=256, micro_batch_size=16, seed=0)
    in_memory = TrainBatches(tokens, seq_len=256, micro_batch_size=16, seed=0)
    for step in range(3):
        for got, expected in zip(from_file.get(step), in_memory.get(step)):
            assert torch.equal(got, expected)
    assert recorded.reads == [16 * 257] * 3


def test_too_short_token_files_are_refused():
    with pytest.raises(DataError, match="seq_len"):
        TrainBatches(np.arange(33, dtype=np.uint16), seq_len=32, micro_batch_size=1, seed=0)
    TrainBatches(np.arange(34, dtype=np.uint16), seq_len=32, micro_batch_size=1, seed=0).get(0)
    with pytest.raises(DataError, match="rank"):
        TrainBatches(TOKENS, 16, 1, seed=0, rank=2, world_size=2)


def test_eval_windows_are_fixed_evenly_spread_and_non_overlapping():
    windows = eval_windows(TOKENS[:10_001], seq_len=100, num_windows=10)
    assert windows.shape == (10, 101) and windows.dtype == torch.int64
    assert torch.equal(windows, eval_windows(TOKENS[:10_001], seq_len=100, num_windows=10))
    first = windows[:, 0].tolist()
    assert first == list(range(0, 10_000, 1000))  # every 10th of the 100 tiles
    assert torch.equal(windows[:, 1:], windows[:, :-1] + 1)


def test_eval_windows_cover_the_split_when_asked_for_more_than_fits():
    tokens = TOKENS[:1_050]
    windows = eval_windows(tokens, seq_len=100, num_windows=1_000)
    assert windows.shape == (10, 101)  # (1050 - 1) // 100 tiles
    targets = windows[:, 1:].flatten().tolist()
    assert sorted(targets) == list(range(1, 1_001))  # each target scored exactly once


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_eval_windows_split_across_ranks_cover_the_set(world_size):
    tokens = TOKENS[:20_001]
    shards = [eval_windows(tokens, 100, 10, rank=r, world_size=world_size) for r in range(world_size)]
    assert len({len(s) for s in shards}) == 1  # every rank runs the same number of forward passes
    union = sorted(int(w[0]) for s in shards for w in s)
    expected = eval_windows(tokens, 100, 10 - 10 % world_size)  # rounded down to a multiple of world_size
    assert union == sorted(expected[:, 0].tolist())


def test_eval_windows_need_more_than_one_window_of_validation():
    with pytest.raises(DataError, match=r"validation split has 101 tokens.*seq_len\+1=101"):
        eval_windows(TOKENS[:101], seq_len=100, num_windows=4)
    with pytest.raises(DataError, match="world_size=4"):
        eval_windows(TOKENS[:302], seq_len=100, num_windows=4, rank=0, world_size=4)


def test_eval_windows_edge_cases_name_what_is_wrong():
    tokens = np.arange(1000, dtype=np.uint16)
    assert eval_windows(tokens, 10, num_windows=1).shape == (1, 11)  # exactly the one asked for
    assert eval_windows(tokens, 10, num_windows=0).shape == (1, 11)  # at least one
    assert eval_windows(np.arange(20, dtype=np.uint16), 10, 5).shape == (1, 11)  # 20 tokens: one window of 10 + 1
    with pytest.raises(DataError, match=r"need 0 <= rank < world_size, got rank=2, world_size=2"):
        eval_windows(tokens, 10, 4, rank=2, world_size=2)
    with pytest.raises(DataError, match=r"fewer than world_size=3; use a shorter sequence length or more validation"):
        eval_windows(np.arange(25, dtype=np.uint16), 10, 4, rank=0, world_size=3)


def test_train_batches_defaults_and_bad_values_name_what_is_wrong():
    tokens = np.arange(100, dtype=np.uint16)
    batches = TrainBatches(tokens, 1, 4, seed=0)  # seq_len 1 is the smallest, and one process by default
    x, y = batches.get(3)
    assert x.shape == (4, 1) and torch.equal(x, batches.get(3, 0)[0]) and torch.equal(y, x + 1)
    with pytest.raises(DataError, match=r"seq_len=0 must be at least 1"):
        TrainBatches(tokens, 0, 4, seed=0)
    with pytest.raises(DataError, match=r"the train split has 100 tokens, not more than seq_len\+1=100; use a shorter"):
        TrainBatches(tokens, 99, 4, seed=0)
    with pytest.raises(DataError, match=r"seed=-1 must be non-negative"):
        TrainBatches(tokens, 8, 4, seed=-1)


def test_batches_default_to_one_process():
    tokens = np.arange(1000, dtype=np.uint16)
    default, explicit = TrainBatches(tokens, 8, 4, seed=3), TrainBatches(tokens, 8, 4, seed=3, rank=0, world_size=1)
    assert all(torch.equal(a, b) for a, b in zip(default.get(5, 1), explicit.get(5, 1)))
    with pytest.raises(DataError, match="0 <= rank < world_size, got 4, 1, 1"):  # rank 1 of one process
        TrainBatches(tokens, 8, 4, seed=3, rank=1)


# ---- data.sampling=epochs: EpochBatches ------------------------------------------------------------------------


def drawn(batches, steps: int) -> list:
    """Every window start one process draws over `steps` steps, in sample order: (step, micro_step, row)."""
    return [
        start
        for step in range(steps)
        for micro in range(batches.grad_accum_steps)
        for start in batches.get(step, micro)[0][:, 0].tolist()
    ]


def test_every_window_is_drawn_exactly_once_per_epoch_at_a_new_offset_and_order():
    """61 windows per epoch and 6 per step (3 rows × 2 micro-steps): steps cross epoch ends mid-batch. Each epoch
    is one offset in [0, seq_len) plus a permutation of the 61 non-overlapping windows from there."""
    tokens = np.arange(1_000, dtype=np.int64)  # token i is i: a window's first input is its start
    batches = EpochBatches(tokens, seq_len=16, micro_batch_size=3, seed=0, grad_accum_steps=2)
    per_epoch = batches.windows_per_epoch
    assert per_epoch == (1_000 - 16) // 16 == 61
    starts = drawn(batches, steps=-(-8 * per_epoch // 6))
    epochs = [starts[e * per_epoch : (e + 1) * per_epoch] for e in range(8)]
    offsets, orders = [], []
    for epoch in epochs:
        offset = epoch[0] % 16
        assert all(start % 16 == offset for start in epoch)
        order = [(start - offset) // 16 for start in epoch]
        assert sorted(order) == list(range(per_epoch))  # each window once
        assert max(epoch) + 17 <= 1_000  # the last window's last target is inside the split
        offsets.append(offset)
        orders.append(order)
    assert len(set(offsets)) > 1 and all(a != b for a, b in zip(orders, orders[1:]))
    assert orders[0] != sorted(orders[0])  # shuffled, not read front to back


def test_an_epoch_makes_nearly_every_training_token_a_target_where_random_windows_reach_63_percent():
    """One epoch's worth of windows: epochs sampling scores all but at most two windows' worth of tokens; random
    draws with replacement leave about 1/e of the windows undrawn (the 36.6 % of issue 40)."""
    tokens = np.arange(64_000, dtype=np.int64)
    reach = {}
    for name, sampler in SAMPLERS.items():
        batches = sampler(tokens, seq_len=32, micro_batch_size=40, seed=5)
        per_epoch = windows_per_epoch(len(tokens), 32)
        targets = np.zeros(len(tokens), dtype=bool)
        for step in range(per_epoch // 40):  # 1,999 windows: 49 whole steps, still inside epoch 0
            targets[batches.get(step)[1].flatten().numpy()] = True
        reach[name] = targets.mean()
    assert reach["epochs"] >= (49 * 40 * 32) / 64_000  # every window drawn was a new one
    assert reach["epochs"] > 0.97 and 0.55 < reach["random"] < 0.70, reach


def test_epoch_batches_are_a_pure_function_of_seed_step_micro_step_and_rank():
    """A fresh object (a resumed run) gives the same batch; the order asked in does not matter (the epoch's
    order is memoised, not state); the seed changes it."""
    a = EpochBatches(TOKENS, 16, 4, seed=3, grad_accum_steps=2)
    sequential = {(step, micro): a.get(step, micro)[0] for step in range(0, 3_000, 7) for micro in (0, 1)}
    b = EpochBatches(TOKENS, 16, 4, seed=3, grad_accum_steps=2)
    for key in reversed(list(sequential)):
        assert torch.equal(b.get(*key)[0], sequential[key])
    assert not torch.equal(a.get(0)[0], EpochBatches(TOKENS, 16, 4, seed=4, grad_accum_steps=2).get(0)[0])


def test_epoch_batches_split_ranks_as_one_process_with_their_batch_would():
    """2 ranks × 3 rows = 1 process × 6 rows, micro-step by micro-step; the ranks never share a window; the
    micro-steps of one step are distinct windows; a micro-step outside the step's accumulation is refused."""
    single = EpochBatches(TOKENS, 16, micro_batch_size=6, seed=1, grad_accum_steps=2)
    pair = [
        EpochBatches(TOKENS, 16, micro_batch_size=3, seed=1, rank=r, world_size=2, grad_accum_steps=2) for r in range(2)
    ]
    for step in (0, 1, 1_041, 2_083):  # 12,499 windows per epoch, 12 a step: 1041 and 2083 cross an epoch's end
        step_starts = []
        for micro in (0, 1):
            whole = single.get(step, micro)
            parts = [batches.get(step, micro) for batches in pair]
            assert torch.equal(whole[0], torch.cat([p[0] for p in parts]))
            assert torch.equal(whole[1], torch.cat([p[1] for p in parts]))
            assert not starts(parts[0][0]) & starts(parts[1][0])
            step_starts += whole[0][:, 0].tolist()
        assert len(set(step_starts)) == 12
    with pytest.raises(DataError, match=r"micro_step=2 is outside 0..1 \(grad_accum_steps=2\)"):
        single.get(0, 2)
    with pytest.raises(DataError, match=r"grad_accum_steps=0 must be at least 1"):
        EpochBatches(TOKENS, 16, 6, seed=1, grad_accum_steps=0)


@pytest.mark.parametrize("num_tokens", [34, 40, 63, 64, 65, 95, 96, 97, 1_000])
def test_windows_per_epoch_fit_at_every_offset(num_tokens):
    """The count is the most that fits at every offset in [0, seq_len) (one more does not fit at the last), so
    every epoch is as long; a split of fewer than two windows still has one, its offsets narrowed to fit."""
    seq_len, count = 32, windows_per_epoch(num_tokens, 32)
    last_window_end = lambda offset, n: offset + (n - 1) * seq_len + seq_len + 1  # noqa: E731
    if num_tokens >= 2 * seq_len:
        assert all(last_window_end(offset, count) <= num_tokens for offset in range(seq_len))
        assert last_window_end(seq_len - 1, count + 1) > num_tokens
    else:
        assert count == 1
    batches = EpochBatches(np.arange(num_tokens, dtype=np.int64), seq_len, 8, seed=0)
    for step in range(20):
        x, y = batches.get(step)
        assert int(y.max()) <= num_tokens - 1 and x.shape == (8, seq_len)


def test_data_sampling_names_a_sampler():
    assert DataConfig().sampling == "epochs"  # the default since every paired seed favoured it (BENCHMARKS.md)
    with pytest.raises(ValueError, match=r"^data.sampling='sequential' is unknown; choose one of random, epochs$"):
        DataConfig(sampling="sequential")
