"""Export a checkpoint as a Hugging Face LlamaForCausalLM directory (model, config, tokenizer).

Usage: python scripts/export_hf.py CHECKPOINT|RUN_DIR|latest OUT_DIR [--force]
Then:  AutoModelForCausalLM.from_pretrained(OUT_DIR), AutoTokenizer.from_pretrained(OUT_DIR)
"""

import argparse

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)

from interop.hf_export import export_checkpoint
from training.checkpoint import resolve_checkpoint
from training.program import add_no_verify, description, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("checkpoint", help="a checkpoint dir, a run dir (its newest checkpoint) or 'latest'")
    p.add_argument("out_dir", help="the Hugging Face model directory to write")
    p.add_argument("--force", action="store_true", help="replace OUT_DIR if it exists and is not empty")
    add_no_verify(p)
    args = p.parse_args(argv)
    ckpt = resolve_checkpoint(args.checkpoint)  # `latest`, `best` or a run dir: say which checkpoint went out
    out = export_checkpoint(str(ckpt), args.out_dir, force=args.force, verify=args.verify)
    print(f"exported {ckpt} to {out}: load it with transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


if __name__ == "__main__":
    run(main)
