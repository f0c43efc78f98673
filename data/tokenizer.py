"""Byte-level BPE with Hugging Face `tokenizers`: train one on a corpus, or load a tokenizer.json."""
import hashlib
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from data.errors import DataError

# Trained first, so they get ids 0, 1, 2 in this order; the HF export reads the strings from here.
SPECIAL_TOKENS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>"}
# Every byte must have its own token, or some text would have no encoding at all.
MIN_VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)


def check_vocab_size(vocab_size: int) -> None:
    if vocab_size < MIN_VOCAB_SIZE:
        raise DataError(
            f"data.vocab_size={vocab_size} is too small: byte-level BPE needs 256 byte tokens + "
            f"{len(SPECIAL_TOKENS)} special tokens; set data.vocab_size>={MIN_VOCAB_SIZE}"
        )


def train_tokenizer(texts: Iterable[List[str]], vocab_size: int) -> Tokenizer:
    """Train a byte-level BPE of `vocab_size` tokens (special tokens included) on batches of text.

    decode(encode(s)) == s for any unicode string: the pre-tokenizer maps every byte to a
    printable symbol, the full byte alphabet is seeded, and no prefix space is invented.
    Encoding adds no BOS/EOS (no post-processor): the caller decides where documents end.
    """
    check_vocab_size(vocab_size)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def load_tokenizer(path) -> Tokenizer:
    """A tokenizer.json written by `tokenizers` (ours or anyone's), with a clear error if it isn't."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"tokenizer file {path} does not exist; fix data.tokenizer_path or set it to null to train one")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:  # tokenizers raises a bare Exception on malformed JSON
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise DataError(f"{path} is not a valid tokenizer.json ({reason}); "
                        "point data.tokenizer_path at a file saved by `tokenizers`") from None


def special_token_ids(tokenizer: Tokenizer, source: str = "the tokenizer") -> Dict[str, int]:
    """{"bos_id", "eos_id", "pad_id"}; a tokenizer without our special tokens cannot mark document ends."""
    ids = {}
    for role, token in SPECIAL_TOKENS.items():
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise DataError(f"{source} has no '{token}' token; add {list(SPECIAL_TOKENS.values())} as special "
                            "tokens, or set data.tokenizer_path=null to train one")
        ids[f"{role}_id"] = token_id
    return ids


def file_hash(path) -> str:
    """Short content hash: the identity of a tokenizer.json (and of every cache built with it)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


def batched_texts(batches: Iterable[List[Optional[str]]], max_bytes: Optional[int]) -> Iterator[List[str]]:
    """Non-empty texts from `batches`, stopping once about `max_bytes` UTF-8 bytes have been yielded."""
    seen = 0
    for batch in batches:
        texts = [t for t in batch if t and not t.isspace()]
        yield texts
        seen += sum(len(t.encode("utf-8")) for t in texts)
        if max_bytes is not None and seen >= max_bytes:
            return
