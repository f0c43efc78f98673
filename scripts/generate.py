"""Generate text from a checkpoint: prompts from the command line, files or stdin, streamed to the terminal.

Usage: python scripts/generate.py CHECKPOINT|RUN_DIR|latest|HF_LLAMA_DIR [--prompt TEXT ...] [--prompt-file F ...] [-]
       [--max-new-tokens 200] [--temperature 0.8] [--top-k 50] [--top-p 0.95] [--num-samples 1] [--seed 0]
       [--device auto|cpu|cuda|mps] [--dtype fp32|bf16] [--no-stop-at-eos]
"""

import argparse
import contextlib
import sys
import time

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)
import torch

from data.tokenizer import read_special_tokens
from interop.hf import checkpoint_for
from model.generate import SAMPLING, check_sampling_args, generate
from training.checkpoint import load_model
from training.distributed import pick_device
from training.program import add_no_verify, description, read_utf8, run

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument(
        "checkpoint",
        help="a checkpoint dir, a run dir (its newest checkpoint), 'latest' (newest "
        "under ./outputs) or a Hugging Face Llama directory",
    )
    p.add_argument("stdin", nargs="?", choices=["-"], help="'-': read a prompt from stdin")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeat for a batch)")
    p.add_argument("--prompt-file", action="append", default=[], help="a file whose text is one prompt (repeatable)")
    p.add_argument("--lines", action="store_true", help="each non-empty line of files/stdin is its own prompt")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--temperature", type=float, default=SAMPLING["temperature"], help="0 = greedy (argmax)")
    p.add_argument(
        "--top-k", type=int, default=SAMPLING["top_k"], help="sample among the k most likely tokens; 0 = off"
    )
    p.add_argument("--top-p", type=float, default=SAMPLING["top_p"], help="nucleus sampling mass; 1 = off")
    p.add_argument("--num-samples", type=int, default=1, help="samples per prompt")
    p.add_argument("--seed", type=int, default=None, help="makes sampling reproducible")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument(
        "--no-stop-at-eos",
        dest="stop_at_eos",
        action="store_false",
        help="keep generating past the end-of-document token",
    )
    p.add_argument(
        "--no-kv-cache",
        dest="use_cache",
        action="store_false",
        help="recompute the whole sequence each step (slow; for checking the cache)",
    )
    add_no_verify(p)
    return p.parse_args(argv)


def read_prompts(args: argparse.Namespace) -> list:
    texts = [read_utf8(path, "--prompt-file") for path in args.prompt_file]
    if args.stdin == "-":
        try:
            texts.append(sys.stdin.read())
        except UnicodeDecodeError as e:
            raise ValueError(f"stdin is not UTF-8 text ({e.reason} at byte {e.start}); pipe UTF-8 text") from None
    if args.lines:
        found = [line for text in texts for line in text.splitlines() if line.strip()]
    else:  # one trailing newline is the file's end, not part of the prompt
        found = [t[:-1] if t.endswith("\n") else t for t in texts]
    prompts = args.prompt + found
    if not prompts:
        raise ValueError(
            "no prompt given; use --prompt TEXT, --prompt-file FILE or '-' for stdin "
            "(--prompt '' starts a new document)"
        )
    return prompts


def check_prompt_lengths(model, tokenizer, prompts: list, max_new_tokens: int) -> None:
    """Refuse a prompt the context cannot hold before anything is printed; say so when generation will slide the
    context (model/generate.py generate_ids), rather than do it silently."""
    lengths, context = [len(tokenizer.encode(p).ids) for p in prompts], model.cfg.max_seq_len
    longest = max(lengths)
    if longest >= context:
        which = lengths.index(longest) + 1
        raise ValueError(
            f"prompt {which} has {longest} tokens, but the model's context is {context} "
            f"(model.max_seq_len), room for a prompt of at most {context - 1}; shorten it"
        )
    if longest + max_new_tokens > context:
        print(
            f"note: a {longest}-token prompt + {max_new_tokens} new tokens exceed the model's context of "
            f"{context}; once it is full, generation continues from the last {context // 2} tokens",
            file=sys.stderr,
        )


def main(argv=None) -> int:
    args = parse_args(argv)
    # Checked as given (--top-p 2 is an error, not "off"); then 0 / 1 switch them off.
    check_sampling_args(args.max_new_tokens, args.temperature, args.top_k or None, args.top_p, args.num_samples)
    if args.seed is not None and not 0 <= args.seed < 2**63:  # torch's generators take 64-bit seeds
        raise ValueError(f"--seed {args.seed} must be an integer from 0 to 2**63 - 1")
    top_k, top_p = args.top_k or None, args.top_p if args.top_p < 1 else None
    device = pick_device(args.device, option="--device")
    prompts = read_prompts(args)
    with contextlib.ExitStack() as stack:  # a Hugging Face directory: a temporary checkpoint, removed at the end
        path, label = checkpoint_for(args.checkpoint, stack, args.verify)
        model, tokenizer, ckpt = load_model(path, device=device, dtype=DTYPES[args.dtype], verify=args.verify)
        eos = read_special_tokens(ckpt)["eos"]
    check_prompt_lengths(model, tokenizer, prompts, args.max_new_tokens)  # before anything is printed
    print(f"checkpoint: {label or ckpt} ({device}, {args.dtype})", file=sys.stderr)
    rows = [p for p in prompts for _ in range(args.num_samples)]
    streaming = len(rows) == 1  # one sequence streams live; a batch prints each text when it is done
    if streaming:
        print(rows[0], end="", flush=True)
    new_ids = []  # every generated id of every row, for the tokens/s line
    started = time.perf_counter()
    texts = generate(
        model,
        tokenizer,
        prompts,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=top_k,
        top_p=top_p,
        num_samples=args.num_samples,
        seed=args.seed,
        stop_at_eos=args.stop_at_eos,
        eos_token=eos,
        use_cache=args.use_cache,
        on_token=lambda row, token_id: new_ids.append(token_id),
        on_text=(lambda row, piece: print(piece, end="", flush=True)) if streaming else None,
    )
    elapsed = time.perf_counter() - started
    if streaming:
        print()
    else:
        for i, (prompt, text) in enumerate(zip(rows, texts)):
            print(f"==== prompt {i // args.num_samples + 1}, sample {i % args.num_samples + 1} ====")
            print(prompt + text)
    print(
        f"{len(new_ids)} new tokens in {elapsed:.2f} s ({len(new_ids) / max(elapsed, 1e-9):.1f} tokens/s)",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    run(main)
