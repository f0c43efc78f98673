"""Evaluation, the one way minillama scores text (validation, scripts/evaluate.py, the studies): one EOS of context,
then every token predicted once, by windows of context T and stride S (S < T: Hugging Face's sliding recipe); bits
per byte = Σ nats / ln 2 / the split's UTF-8 bytes (meta.json's val_bytes)."""

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

import numpy as np
import torch

from training import distributed as D

IGNORE_INDEX = -100  # a target with this value is not scored (context, padding, masked prompts)


@dataclass
class Windows:
    """Rows of model inputs and their targets."""

    inputs: torch.Tensor  # (N, T) int64
    targets: torch.Tensor  # (N, T) int64

    @classmethod
    def from_tiles(cls, tiles: torch.Tensor) -> "Windows":
        """(N, T + 1) token windows (data/loader.py eval_windows) → inputs and targets shifted by one."""
        return cls(tiles[:, :-1], tiles[:, 1:])

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def batches(self, size: int) -> Iterator["Windows"]:
        for i in range(0, len(self), size):
            yield Windows(self.inputs[i : i + size], self.targets[i : i + size])


@dataclass
class WindowPlan:
    """Where each window sits in the stream (the stream's targets are positions 1..L)."""

    starts: np.ndarray  # first input position
    first: np.ndarray  # first position it predicts
    ends: np.ndarray  # last position it predicts (inclusive)
    width: int  # input columns per row: min(context, L)

    def __len__(self) -> int:
        return len(self.starts)


def window_plan(num_targets: int, context: int, stride: Optional[int] = None) -> WindowPlan:
    """The windows that predict positions 1..num_targets, each exactly once."""
    stride = context if stride is None else stride
    if context < 1 or not 1 <= stride <= context:
        raise ValueError(f"need 1 <= stride <= context, got stride={stride}, context={context}")
    if num_targets < 1:
        raise ValueError("nothing to score: the text has no tokens")
    starts = np.arange(1 + -(-max(0, num_targets - context) // stride), dtype=np.int64) * stride
    ends = np.minimum(starts + context, num_targets)
    return WindowPlan(starts, np.concatenate([[1], ends[:-1] + 1]), ends, min(context, num_targets))


def gather(stream: np.ndarray, plan: WindowPlan, rows: np.ndarray) -> Windows:
    """The plan's `rows` as tensors; a short last window is padded on the right with its own last token (causal:
    padding changes nothing before it, and scores nothing)."""
    positions = plan.starts[rows, None] + np.arange(plan.width)  # (n, width) input positions
    last = plan.ends[rows, None]
    target_pos = positions + 1
    scored = (target_pos >= plan.first[rows, None]) & (target_pos <= last)
    targets = np.where(scored, stream[np.minimum(target_pos, last)], IGNORE_INDEX)
    return Windows(
        torch.from_numpy(stream[np.minimum(positions, last - 1)].astype(np.int64)),
        torch.from_numpy(targets.astype(np.int64)),
    )


def scoring_stream(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """One EOS of context, then the tokens: every token gets predicted."""
    return np.concatenate([np.asarray([eos_id], dtype=np.int64), np.asarray(tokens, dtype=np.int64)])


def full_split_windows(
    tokens: np.ndarray, context: int, eos_id: int, stride: Optional[int] = None, rank: int = 0, world_size: int = 1
) -> Windows:
    """This rank's share (r, r + world, …) of the windows that score every token once, padded to one length with rows
    that score nothing: every rank runs the same forward passes (FSDP)."""
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    plan = window_plan(len(tokens), context, stride)
    mine = np.arange(rank, len(plan), world_size)
    windows = gather(scoring_stream(tokens, eos_id), plan, mine)
    if missing := -(-len(plan) // world_size) - len(mine):
        windows = Windows(
            torch.cat([windows.inputs, windows.inputs[:1].expand(missing, -1)]),
            torch.cat([windows.targets, torch.full_like(windows.targets[:missing], IGNORE_INDEX)]),
        )
    return windows


@dataclass
class SplitWindows:
    """A stream's windows, gathered batch by batch: a large split is never tiled into memory at once."""

    stream: np.ndarray
    plan: WindowPlan

    def __len__(self) -> int:
        return len(self.plan)

    def batches(self, size: int) -> Iterator[Windows]:
        for start in range(0, len(self.plan), size):
            yield gather(self.stream, self.plan, np.arange(start, min(start + size, len(self.plan))))


def split_windows(tokens: np.ndarray, eos_id: int, context: int, stride: Optional[int] = None) -> SplitWindows:
    """The windows that score every token of `tokens` once (scripts/evaluate.py)."""
    return SplitWindows(scoring_stream(tokens, eos_id), window_plan(len(tokens), context, stride))


@dataclass
class Score:
    """What a scoring pass adds up; on a sample of a split, `bytes` is its share (tokens × the split's bytes/token)."""

    nats: float  # Σ -log p(token | its context)
    tokens: int
    bytes: float

    @property
    def loss(self) -> float:
        return self.nats / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def bits_per_byte(self) -> float:
        return self.nats / math.log(2) / self.bytes  # nats → bits, per UTF-8 byte: comparable across tokenizers


@torch.no_grad()
def score(
    loss_module,
    windows,
    batch_size: int,
    device: torch.device,
    autocast: Callable,
    on_batch: Optional[Callable[[int], None]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(Σ nats, tokens scored) as float64 tensors on the device (no host sync per batch). A short batch is padded with
    rows that score nothing: a compiled loss keeps its one graph (a recompile costs ~30 s on a CPU)."""
    nats = torch.zeros((), device=device, dtype=torch.float64)
    tokens = torch.zeros((), device=device, dtype=torch.float64)
    for batch in windows.batches(batch_size):
        inputs, targets, pad = batch.inputs, batch.targets, batch_size - len(batch)
        if pad > 0 and len(windows) > batch_size:
            inputs = torch.cat([inputs, inputs[:1].expand(pad, -1)])
            targets = torch.cat([targets, targets.new_full((pad, targets.shape[1]), IGNORE_INDEX)])
        inputs, targets = inputs.to(device), targets.to(device)
        scored = (targets != IGNORE_INDEX).sum().double()
        with autocast():
            mean = loss_module(inputs, targets)
        nats += torch.where(scored > 0, mean.double() * scored, 0.0)  # a batch scoring nothing has mean 0/0
        tokens += scored
        if on_batch is not None:
            on_batch(int((batch.targets != IGNORE_INDEX).sum()))  # counted on the host copy: no sync
    return nats, tokens


@torch.no_grad()
def evaluate(compute_loss, windows, batch_size: int, autocast: Callable, meta: dict, info: D.DistInfo) -> dict:
    """Validation loss, perplexity and bits per byte over every rank's windows, through the training loss module:
    evaluation runs the graph training runs."""
    compute_loss.eval()
    nats, tokens = score(compute_loss, windows, batch_size, info.device, autocast)
    nats, tokens = (D.all_reduce_mean(t, info).item() for t in (nats, tokens))  # note: a CPU-GPU sync point
    compute_loss.train()
    # A sample is charged the split's bytes per token; with eval_windows=all that is exactly val_bytes.
    result = Score(nats, tokens, tokens * meta["val_bytes"] / meta["val_tokens"])
    return {"val_loss": result.loss, "val_ppl": result.perplexity, "val_bpb": result.bits_per_byte}
