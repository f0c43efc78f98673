"""The fast path of encoding a corpus: a byte-level BPE tokenizer.json (the kind minillama trains) run by
`tiktoken`'s encoder, ~5-10× faster than `tokenizers` on a CPU, with the same ids.

Why the ids are the same: tiktoken merges, in each pre-token, the adjacent pair whose joined bytes have the
lowest rank; `tokenizers` applies the BPE merges in the order training learnt them. With each token's rank
its id — ids follow the merge order for a trained BPE — the two agree on a vocabulary that BPE training
made, and the pre-tokenizer is GPT-2's regex in both. Only a tokenizer of exactly that shape qualifies
(`fast_encoder` says why not otherwise), and token_files.py compares the first batch of every split with
`tokenizers` before trusting it, falling back to `tokenizers` on any difference."""
import json
from pathlib import Path
from typing import Optional, Tuple

# GPT-2's pre-tokenizer, which `tokenizers`' ByteLevel(use_regex=True) applies.
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def byte_decoder() -> dict:
    """ByteLevel's printable character of each byte, inverted: character → byte (GPT-2's bytes_to_unicode)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = dict(zip(printable, map(chr, printable))), 0
    for byte in range(256):
        if byte not in chars:  # control bytes, space, … get the characters after U+00FF, in order
            chars[byte], extra = chr(256 + extra), extra + 1
    return {c: b for b, c in chars.items()}


def fast_encoder(path: Path) -> Tuple[Optional[object], str]:
    """(a tiktoken Encoding of the tokenizer.json at `path`, '') — or (None, why it does not qualify)."""
    try:
        import tiktoken
    except ImportError:
        return None, "tiktoken is not installed"
    spec = json.loads(Path(path).read_text())
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    shape = {"model": model.get("type"), "pre_tokenizer": pre.get("type"), "use_regex": pre.get("use_regex"),
             "add_prefix_space": pre.get("add_prefix_space"), "normalizer": spec.get("normalizer"),
             "post_processor": spec.get("post_processor"), "dropout": model.get("dropout"),
             "continuing_subword_prefix": model.get("continuing_subword_prefix"),
             "end_of_word_suffix": model.get("end_of_word_suffix"), "byte_fallback": model.get("byte_fallback")}
    wanted = {"model": "BPE", "pre_tokenizer": "ByteLevel", "use_regex": True, "add_prefix_space": False,
              "normalizer": None, "post_processor": None, "dropout": None, "continuing_subword_prefix": None,
              "end_of_word_suffix": None, "byte_fallback": False}
    differs = [k for k, v in wanted.items() if shape[k] != v and not (k == "byte_fallback" and shape[k] is None)]
    if differs:
        return None, f"not a plain byte-level BPE ({', '.join(f'{k}={shape[k]}' for k in differs)})"
    added = {t["content"]: t["id"] for t in spec.get("added_tokens", [])}
    if any(t.get(k) for t in spec.get("added_tokens", []) for k in ("single_word", "lstrip", "rstrip", "normalized")):
        return None, "an added token strips spaces, matches whole words or is normalized"
    decode = byte_decoder()
    ranks = {}
    for token, rank in model["vocab"].items():
        if token in added:
            continue
        if any(c not in decode for c in token):
            return None, f"token {token!r} is not byte-level"
        ranks[bytes(decode[c] for c in token)] = rank
    if not merges_follow_ids(model.get("merges", []), model["vocab"]):
        return None, "its merges are not in the order of their tokens' ids"
    # Added tokens are matched in the text as `tokenizers` does (a document holding "<|eos|>" gets its id):
    # the caller encodes with allowed_special="all".
    return tiktoken.Encoding(f"minillama-{Path(path).parent.name}", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens=added), ""


def merges_follow_ids(merges: list, vocab: dict) -> bool:
    """Whether merge i makes a token whose id grows with i: what makes rank order equal merge order."""
    previous = -1
    for merge in merges:
        left, right = merge.split(" ", 1) if isinstance(merge, str) else merge
        made = vocab.get(left + right)
        if made is None or made <= previous:
            return False
        previous = made
    return True
