"""Import a Hugging Face Llama model directory (safetensors + tokenizer.json) as a minillama checkpoint.

Usage: python scripts/import_hf.py HF_DIR RUN_DIR
Writes RUN_DIR/checkpoints/step_0000000, which scripts/generate.py RUN_DIR and fine-tuning can use.
"""

import argparse

import _bootstrap  # noqa: F401  (the repository root on sys.path; TORCHINDUCTOR_CACHE_DIR checked)

from interop.hf import import_checkpoint
from training.program import add_no_verify, description, run


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=description(__doc__))
    p.add_argument("hf_dir", help="a directory with config.json, model.safetensors (or shards) and tokenizer.json")
    p.add_argument("run_dir", help="where to write the checkpoint (RUN_DIR/checkpoints/step_0000000)")
    add_no_verify(p)
    args = p.parse_args(argv)
    ckpt = import_checkpoint(args.hf_dir, args.run_dir, verify=args.verify)
    print(f"imported to {ckpt}: try python scripts/generate.py {args.run_dir} --prompt 'Hello'")
    return 0


if __name__ == "__main__":
    run(main)
