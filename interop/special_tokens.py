"""Which tokens of a checkpoint's tokenizer play BOS/EOS/PAD: minillama's own, or those an HF import recorded."""
import json
from pathlib import Path
from typing import Dict, Optional

from training.checkpoint import CheckpointError

SPECIAL_TOKENS_FILE = "special_tokens.json"
# What minillama's data pipeline trains into every tokenizer (ids 0, 1, 2). Kept here rather than
# imported from data/ so that loading a checkpoint does not pull in the data pipeline.
MINILLAMA_SPECIAL_TOKENS = {"bos": "<|bos|>", "eos": "<|eos|>", "pad": "<|pad|>"}
ROLES = tuple(MINILLAMA_SPECIAL_TOKENS)


def read_special_tokens(ckpt: Path) -> Dict[str, Optional[str]]:
    """role → token string (or None). Checkpoints we trained have no file and use minillama's tokens."""
    path = Path(ckpt) / SPECIAL_TOKENS_FILE
    if not path.exists():
        return dict(MINILLAMA_SPECIAL_TOKENS)
    try:
        roles = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{path} is unreadable ({e}); delete it to use minillama's <|bos|>/<|eos|>/<|pad|>")
    if not isinstance(roles, dict) or set(roles) != set(ROLES) or \
            not all(v is None or isinstance(v, str) for v in roles.values()):
        raise CheckpointError(f"{path} must map exactly {list(ROLES)} to token strings or null")
    return roles


def write_special_tokens(ckpt: Path, roles: Dict[str, Optional[str]]) -> None:
    (Path(ckpt) / SPECIAL_TOKENS_FILE).write_text(json.dumps({r: roles.get(r) for r in ROLES}, indent=2))


def special_token_ids(tokenizer, roles: Dict[str, Optional[str]]) -> Dict[str, Optional[int]]:
    """role → id in this tokenizer, None where the role has no token or the tokenizer lacks it."""
    return {role: tokenizer.token_to_id(token) if token is not None else None for role, token in roles.items()}
