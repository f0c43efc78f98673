"""Text generation: temperature / top-k / top-p sampling, the KV-cached decode loop, streamed text."""

from typing import Callable, List, Optional, Sequence

import torch

from model.transformer import Transformer

# scripts/generate.py's defaults and the sample a run prints at each evaluation: what a run shows, a checkpoint makes.
SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep each row's k largest logits (ties with the k-th too); the rest become -inf."""
    if k >= logits.shape[-1]:
        return logits
    return logits.masked_fill(logits < torch.topk(logits, k, dim=-1).values[..., -1:], float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability sums to >= p (the top one always)."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    drop_sorted = probs.cumsum(dim=-1) - probs >= p  # the more likely tokens already reach p
    return logits.masked_fill(torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted), float("-inf"))


def sample_next(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """logits (B, V) → next ids (B,). Temperature 0 is greedy and draws no randomness."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature  # fp32: a bf16 softmax over a large vocabulary is too coarse
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


def check_sampling_args(
    max_new_tokens: int,
    temperature: float,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    num_samples: int = 1,
) -> None:
    """A ValueError naming the bad option: callers check before loading a model."""
    for ok, message in (
        (max_new_tokens >= 0, f"max_new_tokens={max_new_tokens} must be >= 0"),
        (temperature >= 0, f"temperature={temperature} must be >= 0 (0 = greedy)"),
        (top_k is None or top_k >= 1, f"top_k={top_k} must be >= 1 (or unset to disable)"),
        (top_p is None or 0 < top_p <= 1, f"top_p={top_p} must be in (0, 1] (or unset to disable)"),
        (num_samples >= 1, f"num_samples={num_samples} must be >= 1"),
    ):
        if not ok:
            raise ValueError(message)


@torch.inference_mode()
def generate_ids(
    model: Transformer,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    seed: Optional[int] = None,
    eos_id: Optional[int] = None,
    use_cache: bool = True,
    on_token: Optional[Callable[[int, int], None]] = None,
    vocab_limit: Optional[int] = None,
) -> List[List[int]]:
    """Continue each prompt (ids) by up to max_new_tokens ids; returns the new ids per prompt.

    Prompts of different lengths batch without padding masks: rows share positions, the shortest prompt's length
    is prefilled at once, and a longer prompt's row is fed its own tokens until its prompt ends (Meta's reference
    LLaMA does the same). A row stops after `eos_id` (kept as its last id) or its budget. Past the context the
    window slides: it restarts from the last max_seq_len // 2 tokens at position 0 (training windows begin
    mid-text too), refilling the cache in one forward — cached and recomputed generation give the same tokens.
    Only ids below `vocab_limit` (default: the model's vocab_size) are sampled, never a padded vocabulary's rows."""
    check_sampling_args(max_new_tokens, temperature, top_k, top_p)
    max_len = model.cfg.max_seq_len
    vocab_limit = model.cfg.vocab_size if vocab_limit is None else min(vocab_limit, model.cfg.vocab_size)
    if not prompts:
        raise ValueError("no prompts given; pass at least one")
    for i, ids in enumerate(prompts):
        if not 0 < len(ids) < max_len:
            raise ValueError(
                f"prompt {i} has {len(ids)} tokens; it must have 1 to {max_len - 1} "
                f"(the model's max_seq_len={max_len} minus room for one new token)"
            )
        if min(ids) < 0 or max(ids) >= vocab_limit:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_limit})")
    device = model.embed_tokens.weight.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    total_len = int(lengths.max()) + max_new_tokens
    tokens = torch.zeros(len(prompts), total_len, dtype=torch.long, device=device)  # 0: a finished row's filler
    for row, ids in enumerate(prompts):
        tokens[row, : len(ids)] = torch.tensor(ids, device=device)
    is_prompt = torch.arange(total_len, device=device)[None, :] < lengths[:, None]  # (B, total_len)
    last_pos = lengths + max_new_tokens - 1  # the last position each row may write
    done = lengths > last_pos
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    cache = model.new_kv_cache(len(prompts), max_seq_len=min(max_len, total_len)) if use_cache else None
    start = 0  # the window's first position
    for pos in range(int(lengths.min()), total_len):
        if bool(done.all()):
            break
        if pos - start >= max_len:  # slide
            start = pos - max(1, max_len // 2)
            if cache is not None:
                cache.reset()
        if cache is None:
            logits = model(tokens[:, start:pos])[:, -1]
        else:
            logits = model(tokens[:, start + cache.length : pos], cache)[:, -1]
        sampled = sample_next(logits[:, :vocab_limit].float(), temperature, top_k, top_p, generator)
        fresh = ~is_prompt[:, pos] & ~done  # rows that just produced a real new token
        tokens[:, pos] = torch.where(fresh, sampled, tokens[:, pos])
        if on_token is not None:
            for row in fresh.nonzero().flatten().tolist():
                on_token(row, int(sampled[row]))
        if eos_id is not None:
            done |= fresh & (sampled == eos_id)
        done |= last_pos <= pos
    new = [tokens[row, len(ids) : len(ids) + max_new_tokens].tolist() for row, ids in enumerate(prompts)]
    return [ids[: ids.index(eos_id) + 1] if eos_id is not None and eos_id in ids else ids for ids in new]


class TextStream:
    """One row's growing ids as text pieces, holding back a half-decoded UTF-8 character: byte-level BPE can split
    a character across tokens, and its partial bytes decode to U+FFFD. The whole list is decoded each time (merged
    spaces stay right); generations are short, so O(n²) is fine."""

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        return "" if text.endswith("\ufffd") else self._release(text)

    def flush(self) -> str:
        return self._release(self.tokenizer.decode(self.ids, skip_special_tokens=False))

    def _release(self, text: str) -> str:
        piece, self.emitted = text[self.emitted :], len(text)
        return piece


def encode_prompt(tokenizer, prompt: str, start_id: Optional[int]) -> List[int]:
    """The tokenizer's own encoding (no BOS, as in training); '' starts from start_id, as after <|eos|>."""
    ids = tokenizer.encode(prompt).ids
    if ids:
        return ids
    if start_id is None:
        raise ValueError("the prompt is empty and the tokenizer has no end-of-document token to start from")
    return [start_id]


def generate(
    model: Transformer,
    tokenizer,
    prompts: Sequence[str],
    max_new_tokens: int = 128,
    temperature: float = 1.0,
    top_k: Optional[int] = None,
    top_p: Optional[float] = None,
    num_samples: int = 1,
    seed: Optional[int] = None,
    stop_at_eos: bool = True,
    eos_token: Optional[str] = None,
    use_cache: bool = True,
    on_text: Optional[Callable[[int, str], None]] = None,
    on_token: Optional[Callable[[int, int], None]] = None,
) -> List[str]:
    """Continuations of text prompts: len(prompts) × num_samples strings, prompt-major. on_text(row, piece) streams
    each row's text (its pieces concatenate to the returned string); on_token(row, id) sees every id, a stopping
    EOS too. eos_token (the checkpoint's, data.tokenizer.read_special_tokens) ends a row; it is not in the text."""
    check_sampling_args(max_new_tokens, temperature, top_k, top_p, num_samples)
    eos_id = tokenizer.token_to_id(eos_token) if eos_token is not None else None
    rows = [encode_prompt(tokenizer, p, eos_id) for p in prompts for _ in range(num_samples)]
    stop_id = eos_id if stop_at_eos else None
    streams = [TextStream(tokenizer) for _ in rows] if on_text is not None else []

    def each_token(row: int, token_id: int) -> None:
        if on_token is not None:
            on_token(row, token_id)
        piece = streams[row].push(token_id) if streams and token_id != stop_id else ""
        if piece:
            on_text(row, piece)

    new_ids = generate_ids(
        model,
        rows,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        seed,
        stop_id,
        use_cache,
        each_token if on_text is not None or on_token is not None else None,
        vocab_limit=tokenizer.get_vocab_size(),
    )
    for row, stream in enumerate(streams):
        if piece := stream.flush():
            on_text(row, piece)
    if stop_id is not None:
        new_ids = [ids[:-1] if ids and ids[-1] == stop_id else ids for ids in new_ids]
    return [tokenizer.decode(ids, skip_special_tokens=False) for ids in new_ids]
