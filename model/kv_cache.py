"""KVCache: pre-allocated keys and values for every layer, so generation appends instead of recomputing."""
from typing import List, Tuple

import torch


class KVCache:
    """Per-layer (B, n_kv_heads, max_seq_len, head_dim) buffers plus the number of filled positions.

    Sized for the kv heads, not the query heads: with grouped-query attention the cache is
    n_heads / n_kv_heads times smaller, which is the point of GQA at inference.
    """

    def __init__(self, n_layers: int, batch_size: int, max_seq_len: int, n_kv_heads: int, head_dim: int,
                 dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        shape = (batch_size, n_kv_heads, max_seq_len, head_dim)
        self.keys: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values: List[torch.Tensor] = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_seq_len = max_seq_len
        self.length = 0  # positions already filled; the next token's position

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        """Write k, v (B, n_kv_heads, T, head_dim) at positions [length, length+T); return all filled."""
        start, end = self.length, self.length + k.shape[2]
        if end > self.max_seq_len:
            raise ValueError(f"KV cache overflow: {end} positions > max_seq_len={self.max_seq_len}")
        self.keys[layer][:, :, start:end] = k
        self.values[layer][:, :, start:end] = v
        return self.keys[layer][:, :, :end], self.values[layer][:, :, :end]

    def advance(self, n: int) -> None:
        """Called once per forward pass, after every layer has written its n new positions."""
        self.length += n

    def reset(self) -> None:
        self.length = 0
