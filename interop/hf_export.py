"""Export a minillama checkpoint as a Hugging Face Llama directory (model, config, tokenizer, generation config)."""
import shutil
import sys
from pathlib import Path
from typing import Dict, Optional

from data.tokenizer import read_special_tokens, token_ids
from interop.hf import check_llama_compatible, llama_config, to_hf_state_dict
from model import Transformer
from model.parametrization import as_standard
from training.checkpoint import TOKENIZER, load_model, load_model_config, resolve_checkpoint, save_weights
from training.checkpoint.manifest import MANIFEST, read_manifest, write_manifest


def export_checkpoint(checkpoint: str, out_dir: str, force: bool = False, verify: bool = True) -> Path:
    """Write `out_dir` so that AutoModelForCausalLM / AutoTokenizer.from_pretrained(out_dir) load it.

    `checkpoint` is a checkpoint dir, a run dir or `latest`, verified against its manifest unless
    `verify` is off. The directory is assembled next to `out_dir` and renamed into place, so a failed
    export never leaves a half-written model behind; it gets a manifest.json of its own (Hugging Face
    ignores it), which import_hf checks — only when the checkpoint's own files were verified against theirs:
    an export never vouches for weights nobody checked (`verify` off, or a checkpoint from before manifests).
    `force` replaces an existing non-empty `out_dir`.
    """
    ckpt = resolve_checkpoint(checkpoint)
    check_llama_compatible(load_model_config(ckpt))  # before reading any weights
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not force:
        raise FileExistsError(f"{out} exists and is not empty; pass --force to replace it")
    model, tokenizer, _ = load_model(str(ckpt), verify=verify)  # checks files, config, weights and tokenizer
    verified = verify and read_manifest(ckpt) is not None
    tmp = out.with_name(f".{out.name}.export-tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_hf_dir(tmp, model, tokenizer, read_special_tokens(ckpt), ckpt / TOKENIZER)
        if verified:
            write_manifest(tmp)
        else:
            print(f"warning: {out} gets no {MANIFEST}: {ckpt} was not verified against one "
                  f"({'--no-verify' if not verify else 'it has none'}), so nothing vouches for these weights",
                  file=sys.stderr)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        shutil.rmtree(out) if out.is_dir() else out.unlink()
    tmp.rename(out)
    return out


def write_hf_dir(out: Path, model: Transformer, tokenizer, roles: Dict[str, Optional[str]],
                 tokenizer_file: Path) -> None:
    """config.json, model.safetensors, generation_config.json, tokenizer.json + tokenizer_config.json.

    With a padded vocabulary, config.json's vocab_size and the embedding are the padded row count
    and the tokenizer has fewer tokens, as in GPT-2-style HF checkpoints. A mup model is written as its
    sp equivalent (model/parametrization.py `as_standard`), so it imports back as that sp model.
    """
    from transformers import GenerationConfig, PreTrainedTokenizerFast  # interop-only dependency

    # LlamaForCausalLM has no μP knobs: a mup model goes out as the sp model with the same logits, its
    # attention scale folded into q_proj and its output multiplier into an untied lm_head.
    cfg, state = as_standard(model.cfg, model.state_dict())
    ids = token_ids(tokenizer, roles)
    llama_config(cfg, ids).save_pretrained(out)
    save_weights(to_hf_state_dict(state, cfg), out / "model.safetensors")
    # The padding ids (no token has them) are suppressed in HF's generate() too, as in ours.
    n_tokens = min(cfg.vocab_size, tokenizer.get_vocab_size())
    padding = list(range(n_tokens, cfg.padded_vocab_size))
    GenerationConfig(bos_token_id=ids["bos"], eos_token_id=ids["eos"], pad_token_id=ids["pad"],
                     suppress_tokens=padding or None).save_pretrained(out)
    # Wrapping our tokenizer as-is keeps encoding identical; model_max_length lets HF warn about
    # over-long inputs instead of silently running past the trained context.
    specials = {f"{role}_token": token for role, token in roles.items() if token is not None}
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, model_max_length=cfg.max_seq_len, **specials
                            ).save_pretrained(out)
    # save_pretrained re-serialises tokenizer.json with an equivalent no-op post-processor; ship the
    # original bytes so that export → import gives back the very same file.
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
