"""Rounding sizes UP to hardware-friendly multiples: MLP widths and padded vocabularies."""


def find_multiple(n: int, k: int) -> int:
    """The smallest multiple of k that is >= n (litgpt's `find_multiple`): 50257, 64 → 50304.

    Up, never down: a size rounded down would lose capacity (MLP) or token ids (vocabulary).
    """
    if k <= 0:
        raise ValueError(f"cannot round {n} up to a multiple of {k}; the multiple must be > 0")
    return n if n % k == 0 else n + k - n % k
