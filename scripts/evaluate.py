"""Bits per byte, loss and perplexity of a checkpoint on a whole held-out split or text file: every token, once.

Usage: python scripts/evaluate.py CHECKPOINT|RUN_DIR|latest|HF_LLAMA_DIR
         [--data NAME|CONFIG.yaml|CACHE_DIR] [--set KEY=VALUE ...] [--split val|train]
         [--text FILE ...] [--sample-by document|paragraph|line] [--text-column text]
         [--context N] [--stride S] [--batch-size 8] [--device auto] [--dtype auto|bf16|fp32] [--json OUT]

Without --data/--text it scores the validation split of the checkpoint's own training data.
Documents, EOS and windows are counted as training/evaluation.py describes.
"""

import argparse
import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Optional, Sequence

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)
import numpy as np
import torch
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from tqdm.auto import tqdm

from data import PreparedData, prepare
from data.cache import encode_documents, open_cache, read_meta
from data.sources import DataConfig
from data.tokenizer import file_hash, read_special_tokens
from interop.hf import checkpoint_for
from training.checkpoint import CONFIG as CKPT_CONFIG
from training.checkpoint import TOKENIZER, load_model
from training.distributed import pick_device
from training.evaluation import Score, score, split_windows
from training.loop import CausalLMLoss, autocast_context, resolve_precision
from training.program import CONFIGS, add_no_verify, description, read_utf8, run


def load_data_config(data: Optional[str], ckpt: Path, sets: Sequence[str]) -> DataConfig:
    """evaluate.py's data: `--data NAME` (configs/data/NAME.yaml) or `--data FILE.yaml`, else the
    checkpoint's config.yaml data section; `--set KEY=VALUE` on top."""
    if data is None:
        saved = OmegaConf.load(ckpt / CKPT_CONFIG) if (ckpt / CKPT_CONFIG).is_file() else OmegaConf.create()
        if not OmegaConf.is_dict(saved) or "data" not in saved:
            raise ValueError(f"{ckpt} has no training config with a data section; pass --data or --text")
        node = saved.data
    else:
        is_file = data.endswith((".yaml", ".yml"))
        path = Path(data) if is_file else CONFIGS / "data" / f"{data}.yaml"
        if not path.is_file():
            names = sorted(p.stem for p in (CONFIGS / "data").glob("*.yaml"))
            raise ValueError(
                f"--data {data}: no such config or cache directory; use one of {', '.join(names)}, "
                "a YAML file or a prepared cache directory"
            )
        node = OmegaConf.load(path)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(DataConfig), node, OmegaConf.from_dotlist(list(sets)))
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        raise ValueError(f"data config: {str(e).splitlines()[0]}") from None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument(
        "checkpoint",
        help="a checkpoint dir, a run dir (its newest checkpoint), 'latest', or a Hugging "
        "Face Llama directory (config.json + safetensors + tokenizer.json)",
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--data",
        help="a data config: a name under configs/data/, a YAML file, or a prepared cache "
        "directory (with meta.json); default: the checkpoint's training data",
    )
    what.add_argument("--text", nargs="+", metavar="FILE", help=".txt/.md or .jsonl files to score")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a data config field")
    p.add_argument("--split", choices=["val", "train"], default="val", help="which split of the data to score")
    p.add_argument(
        "--sample-by",
        choices=["document", "paragraph", "line"],
        default="document",
        help="text files: one document per file, per blank-line paragraph, or per line",
    )
    p.add_argument("--text-column", default="text", help="jsonl: the field that holds each document")
    p.add_argument("--context", type=int, help="tokens per window (default: the model's max_seq_len)")
    p.add_argument(
        "--stride",
        type=int,
        help="sliding windows S tokens apart, each token scored with >= "
        "context-S+1 tokens before it (default: context, non-overlapping)",
    )
    p.add_argument("--batch-size", type=int, default=8, help="windows per forward pass")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument(
        "--dtype",
        choices=["auto", "bf16", "fp32"],
        default="auto",
        help="bf16 autocast over fp32 weights, as training evaluates; auto: bf16 where it is fast",
    )
    p.add_argument("--json", help="also write the results to this JSON file")
    add_no_verify(p)
    return p.parse_args(argv)


def load_scorer(path: str, device: torch.device, stack: contextlib.ExitStack, verify: bool = True):
    """(model, tokenizer, checkpoint dir, EOS id, what to call it). An HF directory is converted into
    a temporary checkpoint (the same checks as scripts/import_hf.py; deleted on exit)."""
    path, label = checkpoint_for(path, stack, verify)
    model, tokenizer, ckpt = load_model(path, device=device, verify=verify)
    eos = read_special_tokens(ckpt)["eos"]
    eos_id = tokenizer.token_to_id(eos) if eos is not None else None
    if eos_id is None:
        raise ValueError(
            f"{ckpt}: the tokenizer has no EOS token, which ends every scored document; add one to special_tokens.json"
        )
    return model, tokenizer, ckpt, eos_id, label or str(ckpt)


def text_documents(paths: list, sample_by: str, column: str) -> list:
    """The documents of .txt/.md files (split by --sample-by) or .jsonl files (one per line)."""
    docs = []
    for path in map(Path, paths):
        if path.suffix not in (".txt", ".md", ".jsonl"):
            raise ValueError(f"--text {path}: not a .txt, .md or .jsonl file; --text takes the files to score")
        text = read_utf8(path, "--text")
        if path.suffix == ".jsonl":
            docs += [
                _jsonl_text(line, column, f"{path}:{i}") for i, line in enumerate(text.splitlines(), 1) if line.strip()
            ]
        elif sample_by == "paragraph":
            docs += text.split("\n\n")
        else:
            docs += text.splitlines() if sample_by == "line" else [text]
    if all(not d or d.isspace() for d in docs):  # the encoder drops those, as the data pipeline does
        raise ValueError(f"--text {' '.join(paths)}: no non-empty document to score")
    return docs


def _jsonl_text(line: str, column: str, where: str) -> str:
    try:
        value = json.loads(line).get(column)
    except (json.JSONDecodeError, AttributeError):
        raise ValueError(f"{where} is not a JSON object") from None
    if not isinstance(value, str):
        raise ValueError(f"{where} has no string field {column!r}; set --text-column")
    return value


def encode_text_documents(tokenizer, docs: list, eos_id: int) -> tuple:
    """(token ids: each document then EOS; UTF-8 bytes of the documents) by the data pipeline's own encoder
    (data/cache.py; documents without text dropped), so a file scores exactly as a data config holding it would."""
    docs = [d for d in docs if d and not d.isspace()]
    ids = encode_documents(tokenizer, docs, eos_id)
    return (np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)), sum(len(d.encode("utf-8")) for d in docs)


def prepared_data(args, ckpt: Path, tokenizer) -> PreparedData:
    """The data cache whose tokenizer is the checkpoint's: found, built, or re-tokenized with it."""
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    wanted = file_hash(ckpt / TOKENIZER)
    if args.data is not None and (Path(args.data) / "meta.json").is_file():
        if args.set:
            raise ValueError("--set applies to a data config, not to a prepared cache directory")
        directory = Path(args.data)
        data = open_cache(directory, read_meta(directory))
        if data.meta.get("tokenizer_hash") != wanted:
            raise ValueError(
                f"{directory} was tokenized with another tokenizer than {ckpt}'s; "
                "pass its data config instead (--data NAME), which re-tokenizes"
            )
        return data
    cfg = load_data_config(args.data, ckpt, args.set)
    if cfg.tokenizer_path is not None or cfg.vocab_size == tokenizer.get_vocab_size():
        data = prepare(cfg, log=log)  # usually the training run's cache, found in a millisecond
        if data.meta["tokenizer_hash"] == wanted:
            return data
        log(f"data: {data.dir} has another tokenizer than the checkpoint; re-tokenizing with the checkpoint's")
    return prepare(dataclasses.replace(cfg, tokenizer_path=str(ckpt / TOKENIZER)), log=log)


def tokens_to_score(args, ckpt: Path, tokenizer, eos_id: int) -> tuple:
    """(tokens, UTF-8 bytes, EOS id, a description of what they are)."""
    if args.text:
        docs = text_documents(args.text, args.sample_by, args.text_column)
        tokens, n_bytes = encode_text_documents(tokenizer, docs, eos_id)
        return tokens, n_bytes, eos_id, " ".join(args.text)
    data = prepared_data(args, ckpt, tokenizer)
    tokens = data.val_tokens() if args.split == "val" else data.train_tokens()  # verified against meta.json
    source = f"{data.meta['source']} {args.split} split ({data.dir})"
    return tokens, data.meta[f"{args.split}_bytes"], data.meta["eos_id"], source


def check_args(args, max_seq_len: int) -> tuple:
    """(context, stride), after refusing flags that contradict each other or the model."""
    if args.text and (args.set or args.split != "val"):
        raise ValueError("--set and --split apply to a data config; a --text file is scored whole")
    context = max_seq_len if args.context is None else args.context
    if not 1 <= context <= max_seq_len:
        raise ValueError(f"--context {context} must be between 1 and the model's max_seq_len={max_seq_len}")
    stride = context if args.stride is None else args.stride
    if not 1 <= stride <= context:
        raise ValueError(f"--stride {stride} must be between 1 and the context ({context})")
    if args.batch_size < 1:
        raise ValueError(f"--batch-size {args.batch_size} must be at least 1")
    return context, stride


def main(argv=None) -> int:
    args = parse_args(argv)
    device = pick_device(args.device, option="--device")
    precision, _ = resolve_precision(args.dtype, device)
    with contextlib.ExitStack() as stack:
        model, tokenizer, ckpt, eos_id, label = load_scorer(args.checkpoint, device, stack, args.verify)
        context, stride = check_args(args, model.cfg.max_seq_len)
        tokens, n_bytes, eos_id, source = tokens_to_score(args, ckpt, tokenizer, eos_id)
        print(f"checkpoint: {label} ({device}, {precision})", file=sys.stderr)
        with tqdm(total=len(tokens), unit="tok", unit_scale=True, desc="scoring", file=sys.stderr) as bar:
            nats, scored = score(
                CausalLMLoss(model).eval(),
                split_windows(tokens, eos_id, context, stride),
                args.batch_size,
                device,
                autocast_context(precision, device),
                on_batch=bar.update,
            )
    scored = int(scored.item())
    result = Score(nats.item(), scored, n_bytes)
    windows = "non-overlapping" if stride == context else f"stride {stride}"
    print(
        f"scored: {source}\n{scored:,} tokens, {n_bytes:,} bytes ({n_bytes / scored:.3f} bytes/token), "
        f"windows of {context} tokens, {windows}\n"
        f"loss {result.loss:.4f} nats/token | perplexity {result.perplexity:.3f} | "
        f"bits per byte {result.bits_per_byte:.4f}"
    )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "checkpoint": label,
                    "source": source,
                    "tokens": scored,
                    "bytes": n_bytes,
                    "loss": result.loss,
                    "perplexity": result.perplexity,
                    "bits_per_byte": result.bits_per_byte,
                    "context": context,
                    "stride": stride,
                    "precision": precision,
                },
                indent=2,
            )
            + "\n"
        )
    return 0


if __name__ == "__main__":
    run(main)
