"""Text generation: temperature / top-k / top-p sampling, the KV-cached decode loop, streamed text."""
from typing import Callable, List, Optional, Sequence

import torch

from model.kv_cache import KVCache
from model.transformer import Transformer

# Called with (row, token_id) for every generated token, or (row, text) for streamed text.
TokenCallback = Callable[[int, int], None]
TextCallback = Callable[[int, str], None]


# How minillama samples unless told otherwise: scripts/generate.py's defaults and the sample a training run
# prints at each evaluation, so what a run shows is what the checkpoint generates.
SAMPLING = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Keep each row's k largest logits (ties with the k-th are kept too); the rest become -inf."""
    if k >= logits.shape[-1]:
        return logits
    kth_largest = torch.topk(logits, k, dim=-1).values[..., -1:]  # (B, 1): broadcasts over the vocab
    return logits.masked_fill(logits < kth_largest, float("-inf"))


def top_p_filter(logits: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probability sums to >= p."""
    if p >= 1.0:
        return logits
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the strictly more likely tokens
    # A token is needed while the tokens above it have not reached p yet; so the top one always is.
    drop_sorted = mass_before >= p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # back to vocab order
    return logits.masked_fill(drop, float("-inf"))


def sample_next(logits: torch.Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: Optional[float] = None, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """logits (B, V) → next ids (B,). Temperature 0 is greedy argmax and consumes no randomness."""
    if temperature == 0:
        return logits.argmax(dim=-1)
    logits = logits.float() / temperature  # fp32: a bf16 softmax over a large vocab is too coarse
    if top_k is not None:
        logits = top_k_filter(logits, top_k)
    if top_p is not None:
        logits = top_p_filter(logits, top_p)
    return torch.multinomial(logits.softmax(dim=-1), 1, generator=generator).squeeze(-1)


class _Context:
    """What the model sees at each step: tokens[:, start:pos], through the KV cache or recomputed.

    Sliding window: when the window is full (max_seq_len tokens), it restarts from the most recent
    max_seq_len // 2 tokens at position 0 — the model was trained on windows that begin mid-text, so
    this stays in distribution — and the cache is refilled from them in one forward pass. Cached
    and recomputing generation slide at the same positions, so they give the same tokens.
    """

    def __init__(self, model: Transformer, batch_size: int, total_len: int, use_cache: bool):
        self.model, self.max_len = model, model.cfg.max_seq_len
        self.keep = max(1, self.max_len // 2)
        self.start = 0
        # Sized to what this call can use: a short generation from a long-context model stays small.
        self.cache: Optional[KVCache] = (
            model.new_kv_cache(batch_size, max_seq_len=min(self.max_len, total_len)) if use_cache else None)

    def next_logits(self, tokens: torch.Tensor, pos: int) -> torch.Tensor:
        """Logits (B, V) for the token at `pos`, given tokens[:, :pos] (B, total_len) are final."""
        if pos - self.start >= self.max_len:
            self.start = pos - self.keep
            if self.cache is not None:
                self.cache.reset()
        if self.cache is None:
            return self.model(tokens[:, self.start:pos])[:, -1]
        fed = self.start + self.cache.length  # tokens before `fed` are already in the cache
        return self.model(tokens[:, fed:pos], self.cache)[:, -1]


def check_sampling_args(max_new_tokens: int, temperature: float, top_k: Optional[int] = None,
                        top_p: Optional[float] = None, num_samples: int = 1) -> None:
    """Raise a ValueError naming the bad option; callers can check before loading a model."""
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens={max_new_tokens} must be >= 0")
    if temperature < 0:
        raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
    if top_k is not None and top_k < 1:
        raise ValueError(f"top_k={top_k} must be >= 1 (or unset to disable)")
    if top_p is not None and not 0 < top_p <= 1:
        raise ValueError(f"top_p={top_p} must be in (0, 1] (or unset to disable)")
    if num_samples < 1:
        raise ValueError(f"num_samples={num_samples} must be >= 1")


def _check_prompts(model: Transformer, prompts: Sequence[Sequence[int]], vocab_limit: int) -> None:
    if not prompts:
        raise ValueError("no prompts given; pass at least one")
    cfg = model.cfg
    for i, ids in enumerate(prompts):
        if not 0 < len(ids) < cfg.max_seq_len:
            raise ValueError(f"prompt {i} has {len(ids)} tokens; it must have 1 to {cfg.max_seq_len - 1} "
                             f"(the model's max_seq_len={cfg.max_seq_len} minus room for one new token)")
        if min(ids) < 0 or max(ids) >= vocab_limit:
            raise ValueError(f"prompt {i} has token ids outside the vocabulary [0, {vocab_limit})")


@torch.inference_mode()
def generate_ids(model: Transformer, prompts: Sequence[Sequence[int]], max_new_tokens: int = 128,
                 temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
                 seed: Optional[int] = None, eos_id: Optional[int] = None, use_cache: bool = True,
                 on_token: Optional[TokenCallback] = None, vocab_limit: Optional[int] = None) -> List[List[int]]:
    """Continue each prompt (a list of ids) by up to max_new_tokens ids; returns the new ids per prompt.

    Prompts of different lengths batch together without padding masks (the model has none): all
    rows share positions, the common prefix length is prefilled at once, and a row whose prompt
    is longer is fed its own prompt tokens instead of samples until its prompt ends (as Meta's
    reference LLaMA generate does). A row stops after `eos_id` (kept as its last id) or its budget.
    A prompt must leave room in the context (< max_seq_len tokens); generating past the context
    slides it (see `_Context`) instead of failing. Only ids below `vocab_limit` (default: the
    model's vocab_size) are ever produced: the padding rows of a padded vocabulary are never sampled.
    """
    check_sampling_args(max_new_tokens, temperature, top_k, top_p)
    vocab_limit = model.cfg.vocab_size if vocab_limit is None else min(vocab_limit, model.cfg.vocab_size)
    _check_prompts(model, prompts, vocab_limit)
    device = model.embed_tokens.weight.device
    lengths = torch.tensor([len(p) for p in prompts], device=device)
    total_len = int(lengths.max()) + max_new_tokens
    # 0 = filler: a row that has ended keeps being fed it (rows never see each other), and it is dropped.
    tokens = torch.zeros(len(prompts), total_len, dtype=torch.long, device=device)
    for row, ids in enumerate(prompts):
        tokens[row, :len(ids)] = torch.tensor(ids, device=device)
    positions = torch.arange(total_len, device=device)
    is_prompt = positions[None, :] < lengths[:, None]  # (B, total_len)
    last_pos = lengths + max_new_tokens - 1  # the last position each row may write
    done = lengths > last_pos  # all True when max_new_tokens == 0
    generator = torch.Generator(device).manual_seed(seed) if seed is not None else None
    context = _Context(model, len(prompts), total_len, use_cache)

    for pos in range(int(lengths.min()), total_len):
        if bool(done.all()):
            break
        logits = context.next_logits(tokens, pos)[:, :vocab_limit]  # (B, vocab_limit): padding ids cut off
        sampled = sample_next(logits.float(), temperature, top_k, top_p, generator)
        fresh = ~is_prompt[:, pos] & ~done  # rows that just produced a real new token
        tokens[:, pos] = torch.where(fresh, sampled, tokens[:, pos])
        if on_token is not None:
            for row in fresh.nonzero().flatten().tolist():
                on_token(row, int(sampled[row]))
        if eos_id is not None:
            done |= fresh & (sampled == eos_id)
        done |= last_pos <= pos
    return [_new_ids(tokens[row].tolist(), len(ids), max_new_tokens, eos_id) for row, ids in enumerate(prompts)]


def _new_ids(row: List[int], prompt_len: int, max_new_tokens: int, eos_id: Optional[int]) -> List[int]:
    new = row[prompt_len:prompt_len + max_new_tokens]
    if eos_id is not None and eos_id in new:
        new = new[:new.index(eos_id) + 1]
    return new


class TextStream:
    """Turns one row's growing token ids into text pieces, holding back a half-decoded UTF-8 character.

    Byte-level BPE can split a character across tokens; its partial bytes decode to U+FFFD, so text
    is only released once it no longer ends in U+FFFD. Decoding the whole list (not each token)
    keeps multi-byte characters and merged spaces right; generations are short, so O(n²) is fine.
    """

    def __init__(self, tokenizer):
        self.tokenizer, self.ids, self.emitted = tokenizer, [], 0

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=False)
        return "" if text.endswith("\ufffd") else self._release(text)

    def flush(self) -> str:
        """Whatever is left at the end, replacement characters included."""
        return self._release(self.tokenizer.decode(self.ids, skip_special_tokens=False))

    def _release(self, text: str) -> str:
        piece, self.emitted = text[self.emitted:], len(text)
        return piece


def encode_prompt(tokenizer, prompt: str, start_id: Optional[int]) -> List[int]:
    """The tokenizer's own encoding (our BPE adds no BOS, as in training); '' starts from start_id."""
    ids = tokenizer.encode(prompt).ids
    if ids:
        return ids
    if start_id is None:
        raise ValueError("the prompt is empty and the tokenizer has no end-of-document token to start from")
    return [start_id]  # an empty prompt = "a new document starts here", as after <|eos|> in training


def generate(model: Transformer, tokenizer, prompts: Sequence[str], max_new_tokens: int = 128,
             temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None,
             num_samples: int = 1, seed: Optional[int] = None, stop_at_eos: bool = True,
             eos_token: Optional[str] = None, use_cache: bool = True,
             on_text: Optional[TextCallback] = None, on_token: Optional[TokenCallback] = None) -> List[str]:
    """Generate continuations of text prompts; returns len(prompts) * num_samples strings, prompt-major.

    on_text(row, piece) streams each row's text as it is produced; the pieces of a row concatenate
    to its returned string. on_token(row, id) sees every generated id, the stopping EOS included.
    The stopping EOS is not part of the text; other special tokens are. eos_token names the
    end-of-document token — the caller's, from the checkpoint's special tokens (`data.tokenizer.
    read_special_tokens`); None, or a token the tokenizer lacks: never stop early. Only ids the
    tokenizer has are generated, never the padding ids of a padded vocabulary.
    """
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

    new_ids = generate_ids(model, rows, max_new_tokens, temperature, top_k, top_p, seed, stop_id, use_cache,
                           each_token if on_text is not None or on_token is not None else None,
                           vocab_limit=tokenizer.get_vocab_size())
    for row, stream in enumerate(streams):
        piece = stream.flush()
        if piece:
            on_text(row, piece)
    if stop_id is not None:
        new_ids = [ids[:-1] if ids and ids[-1] == stop_id else ids for ids in new_ids]
    return [tokenizer.decode(ids, skip_special_tokens=False) for ids in new_ids]
