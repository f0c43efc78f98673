"""Evaluation, the one way minillama scores text: windows of tokens, the loss loop over them, and bits per
byte — used by training's validation, scripts/evaluate.py and the studies.

Windows that predict each token exactly once (non-overlapping or strided), or a fixed sample of
windows (data/loader.py `eval_windows`), and the summed log-loss as loss, perplexity and bits per byte.

What is scored. A split is documents, each tokenized and followed by EOS (data/token_files.py);
the stream scored is one EOS, as context only, then those tokens. So every token of the split is
predicted — the first one too, as the start of a document, exactly as every later document starts
after the previous one's EOS — and the counts are meta.json's: tokens = val_tokens (EOS included),
bytes = val_bytes (UTF-8 of the documents; EOS has none). bits/byte = Σ nats / ln 2 / bytes.

How windows chain. With context T and stride S (S = T by default), window k reads stream
positions kS .. kS+T-1 and predicts only the positions not predicted before: all T in the first
window, the last S in every other. At S = T the windows tile the stream: each window's first
prediction sees one token (the last target of the window before), its last sees T — nothing is
carried across windows. At S < T every prediction after the first window sees at least T-S+1
tokens, at T/S times the compute (the Hugging Face perplexity recipe).
"""
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Optional, Tuple

import numpy as np
import torch

from training.loss import IGNORE_INDEX
from training.runtime import distributed as D


@dataclass
class Windows:
    """Rows of model inputs and their targets; a target of IGNORE_INDEX is context only (or padding)."""
    inputs: torch.Tensor  # (N, T) int64
    targets: torch.Tensor  # (N, T) int64

    @classmethod
    def from_tiles(cls, tiles: torch.Tensor) -> "Windows":
        """(N, T + 1) token windows (data/loader.py eval_windows) → inputs and targets shifted by one."""
        return cls(tiles[:, :-1], tiles[:, 1:])

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def num_scored(self) -> int:
        return int((self.targets != IGNORE_INDEX).sum())

    def batches(self, size: int) -> Iterator["Windows"]:
        for i in range(0, len(self), size):
            yield Windows(self.inputs[i:i + size], self.targets[i:i + size])


@dataclass
class WindowPlan:
    """Where each window sits in the stream (positions; the stream's targets are positions 1..L)."""
    starts: np.ndarray  # first input position
    first: np.ndarray  # first position it predicts
    ends: np.ndarray  # last position it predicts (inclusive); its inputs are starts .. ends-1
    width: int  # input columns per row: min(context, L)

    def __len__(self) -> int:
        return len(self.starts)


def window_plan(num_targets: int, context: int, stride: Optional[int] = None) -> WindowPlan:
    """The windows that predict positions 1..num_targets of a stream, each exactly once."""
    stride = context if stride is None else stride
    if context < 1 or not 1 <= stride <= context:
        raise ValueError(f"need 1 <= stride <= context, got stride={stride}, context={context}")
    if num_targets < 1:
        raise ValueError("nothing to score: the text has no tokens")
    count = 1 + -(-max(0, num_targets - context) // stride)  # ceil division
    starts = np.arange(count, dtype=np.int64) * stride
    ends = np.minimum(starts + context, num_targets)
    first = np.concatenate([[1], ends[:-1] + 1])  # right after what the window before predicted
    return WindowPlan(starts, first, ends, min(context, num_targets))


def gather(stream: np.ndarray, plan: WindowPlan, rows: np.ndarray) -> Windows:
    """The plan's `rows` as tensors. A short last window is padded on the right with its own last
    token: under causal attention padding never changes the positions before it, and scores nothing."""
    offsets = np.arange(plan.width)
    positions = plan.starts[rows, None] + offsets  # (n, width) input positions
    last = plan.ends[rows, None]  # the last target; inputs run to last - 1
    inputs = stream[np.minimum(positions, last - 1)]
    target_pos = positions + 1
    scored = (target_pos >= plan.first[rows, None]) & (target_pos <= last)
    targets = np.where(scored, stream[np.minimum(target_pos, last)], IGNORE_INDEX)
    return Windows(torch.from_numpy(inputs.astype(np.int64)), torch.from_numpy(targets.astype(np.int64)))


def scoring_stream(tokens: np.ndarray, eos_id: int) -> np.ndarray:
    """One EOS of context, then the tokens (documents + their EOS): every token gets predicted."""
    return np.concatenate([np.asarray([eos_id], dtype=np.int64), np.asarray(tokens, dtype=np.int64)])


def full_split_windows(tokens: np.ndarray, context: int, eos_id: int, stride: Optional[int] = None,
                       rank: int = 0, world_size: int = 1) -> Windows:
    """This rank's share of the windows that score every token of `tokens` once (trainer.eval_windows=all).

    Rank r takes windows r, r + world_size, ...; the ranks' shares are padded to one length with
    rows that score nothing, because every rank must run the same number of forward passes
    (FSDP's collectives). Summed over ranks, exactly len(tokens) targets are scored.
    """
    if not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}")
    plan = window_plan(len(tokens), context, stride)
    mine = np.arange(rank, len(plan), world_size)
    windows = gather(scoring_stream(tokens, eos_id), plan, mine)
    missing = -(-len(plan) // world_size) - len(mine)
    if missing:
        windows = Windows(torch.cat([windows.inputs, windows.inputs[:1].expand(missing, -1)]),
                          torch.cat([windows.targets, torch.full_like(windows.targets[:missing], IGNORE_INDEX)]))
    return windows


@dataclass
class Score:
    """What a scoring pass adds up. On a sample of a split, `bytes` is the sample's share of the split's
    bytes (tokens × the split's bytes per token), so bits per byte is one formula for both."""
    nats: float  # Σ -log p(token | its context), over every scored token
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
        # nats → bits (÷ ln 2), per UTF-8 byte: comparable across tokenizers and vocabularies.
        return self.nats / math.log(2) / self.bytes




@dataclass
class SplitWindows:
    """Every token of a stream in the windows of a WindowPlan, gathered batch by batch: a large split
    is never tiled into memory all at once (scripts/evaluate.py on a big corpus)."""
    stream: np.ndarray
    plan: WindowPlan

    def __len__(self) -> int:
        return len(self.plan)

    def batches(self, size: int) -> Iterator[Windows]:
        for start in range(0, len(self.plan), size):
            yield gather(self.stream, self.plan, np.arange(start, min(start + size, len(self.plan))))


def split_windows(tokens: np.ndarray, eos_id: int, context: int, stride: Optional[int] = None) -> SplitWindows:
    """The windows that score every token of `tokens` once (one EOS of context before the first)."""
    return SplitWindows(scoring_stream(tokens, eos_id), window_plan(len(tokens), context, stride))


@torch.no_grad()
def score(loss_module, windows, batch_size: int, device: torch.device, autocast: Callable,
          on_batch: Optional[Callable[[int], None]] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """(Σ nats, tokens scored) of `windows` (anything with `.batches(size)` yielding Windows) under
    `loss_module(inputs, targets)` — a CausalLMLoss, the mean over targets != IGNORE_INDEX — as float64
    tensors on the device: no host sync per batch. `on_batch(n)` gets each batch's scored count."""
    nats = torch.zeros((), device=device, dtype=torch.float64)
    tokens = torch.zeros((), device=device, dtype=torch.float64)
    for batch in windows.batches(batch_size):
        inputs, targets = batch.inputs.to(device), batch.targets.to(device)
        scored = (targets != IGNORE_INDEX).sum().double()
        with autocast():
            mean = loss_module(inputs, targets)
        # A batch that scores nothing (a rank's padding row under eval_windows=all) has mean 0/0.
        nats += torch.where(scored > 0, mean.double() * scored, 0.0)
        tokens += scored
        if on_batch is not None:
            on_batch(batch.num_scored())  # counted on the host copy: no sync
    return nats, tokens


def score_tokens(loss_module, tokens: np.ndarray, eos_id: int, context: int, stride: Optional[int],
                 batch_size: int, device: torch.device, autocast: Callable,
                 on_batch: Callable[[int], None] = lambda n: None) -> tuple:
    """(Σ nats, tokens scored) of every token of `tokens`, as Python numbers."""
    nats, scored = score(loss_module, split_windows(tokens, eos_id, context, stride), batch_size, device, autocast,
                         on_batch)
    return nats.item(), int(scored.item())


@torch.no_grad()
def evaluate(compute_loss, windows, batch_size: int, autocast: Callable, meta: dict, info) -> dict:
    """Validation loss over the windows of all ranks; perplexity; bits per byte.

    `compute_loss(input_ids, targets)` is the training loss module (compiled, DDP/FSDP-wrapped), so
    evaluation runs the very graph training runs. `windows` are this rank's share: a `Windows`
    (`full_split_windows` for trainer.eval_windows=all, every token once) or (N, seq_len + 1) token
    tiles (data/loader.py `eval_windows`). `meta` holds the validation split's token and UTF-8 byte counts.
    """
    if isinstance(windows, torch.Tensor):
        windows = Windows.from_tiles(windows)
    compute_loss.eval()
    nats, tokens = score(compute_loss, windows, batch_size, info.device, autocast)
    nats, tokens = (D.all_reduce_mean(t, info).item() for t in (nats, tokens))  # note: a CPU-GPU sync point
    compute_loss.train()
    # A sample of the split is charged the split's bytes per token; with eval_windows=all the windows
    # score exactly val_tokens tokens, so this is Σ nats / ln 2 / val_bytes.
    result = Score(nats, tokens, tokens * meta["val_bytes"] / meta["val_tokens"])
    return {"val_loss": result.loss, "val_ppl": math.exp(min(result.loss, 50.0)), "val_bpb": result.bits_per_byte}
