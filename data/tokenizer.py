"""Byte-level BPE with Hugging Face `tokenizers`: train one on a corpus, or load a tokenizer.json — and the special
tokens, minillama's own or those a special_tokens.json beside a tokenizer.json names (an imported model's)."""

import hashlib
import json
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.sources import DataError, first_line

# Role → token, trained first (ids 0, 1, 2). Training appends EOS to every document and prepends nothing.
SPECIAL_TOKENS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>"}
ROLES = tuple(SPECIAL_TOKENS)
SPECIAL_TOKENS_FILE = "special_tokens.json"
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # every byte needs a token, or some text would have no encoding


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB_SIZE:
        raise DataError(
            f"data.vocab_size={vocab_size} is too small: byte-level BPE needs 256 byte tokens + "
            f"{len(SPECIAL_TOKENS)} special tokens; set data.vocab_size>={MIN_VOCAB_SIZE}"
        )


def train_tokenizer(texts: Iterable[List[str]], vocab_size: int) -> Tokenizer:
    """A byte-level BPE of vocab_size tokens (specials included) trained on batches of text. decode(encode(s)) == s:
    every byte maps to a printable symbol, the whole byte alphabet is seeded, no prefix space is invented; encoding
    adds no BOS/EOS (the caller decides where documents end)."""
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(
        texts,
        trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=list(SPECIAL_TOKENS.values()),
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    return tokenizer


def load_tokenizer(path) -> Tokenizer:
    path = Path(path)
    if not path.is_file():
        raise DataError(f"tokenizer file {path} does not exist; fix data.tokenizer_path or set it to null to train one")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception on malformed JSON
        raise DataError(
            f"{path} is not a valid tokenizer.json ({first_line(error)}); point data.tokenizer_path at a file saved by "
            "`tokenizers`"
        ) from None


def token_ids(tokenizer: Tokenizer, roles: Dict[str, Optional[str]]) -> Dict[str, Optional[int]]:
    """role → id in this tokenizer; None where the role has no token or the tokenizer lacks it."""
    return {role: tokenizer.token_to_id(roles[role]) if roles.get(role) is not None else None for role in ROLES}


def special_token_ids(
    tokenizer: Tokenizer, source: str = "the tokenizer", roles: Optional[Dict[str, Optional[str]]] = None
) -> Dict[str, Optional[int]]:
    """{"bos_id", "eos_id", "pad_id"}: every named role must exist, and EOS must be named, or documents could not end."""
    roles = SPECIAL_TOKENS if roles is None else roles
    if roles.get("eos") is None:
        raise DataError(f"{source} has no end-of-document token; name one under 'eos' in {SPECIAL_TOKENS_FILE}")
    ids = token_ids(tokenizer, roles)
    for role, token in roles.items():
        if token is not None and ids[role] is None:
            raise DataError(
                f"{source} has no '{token}' token; add {[t for t in roles.values() if t]} as special "
                "tokens, or set data.tokenizer_path=null to train one"
            )
    return {f"{role}_id": ids[role] for role in ROLES}


def read_special_tokens(directory) -> Dict[str, Optional[str]]:
    """role → token (or None) for the tokenizer.json in `directory`; without a special_tokens.json, minillama's own."""
    path = Path(directory) / SPECIAL_TOKENS_FILE
    if not path.exists():
        return dict(SPECIAL_TOKENS)
    try:
        roles = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); delete it to use minillama's {list(SPECIAL_TOKENS.values())}")
    if (
        not isinstance(roles, dict)
        or set(roles) != set(ROLES)
        or not all(v is None or isinstance(v, str) for v in roles.values())
    ):
        raise DataError(f"{path} must map exactly {list(ROLES)} to token strings or null")
    return roles


def write_special_tokens(directory, roles: Dict[str, Optional[str]]) -> None:
    (Path(directory) / SPECIAL_TOKENS_FILE).write_text(json.dumps({r: roles.get(r) for r in ROLES}, indent=2))


def max_token_id(tokenizer: Tokenizer) -> int:
    """The largest id the tokenizer can produce (added tokens included): the model needs more rows than this."""
    return max(tokenizer.get_vocab(with_added_tokens=True).values())


def file_hash(path) -> str:
    """A tokenizer.json's identity (and of every cache built with it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def batched_texts(
    batches: Iterable[List[Optional[str]]], max_bytes: Optional[int], progress=None
) -> Iterator[List[str]]:
    """Non-empty texts, stopping once about max_bytes UTF-8 bytes have gone by (counted on `progress`, a tqdm bar)."""
    seen = 0
    for batch in batches:
        texts = [t for t in batch if t and not t.isspace()]
        yield texts
        seen += (size := sum(len(t.encode("utf-8")) for t in texts))
        if progress is not None:
            progress.update(size)
        if max_bytes is not None and seen >= max_bytes:
            return
