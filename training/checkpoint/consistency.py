"""Do a checkpoint's files agree with each other, and with the run about to resume from it?

model_config.json, the weights' shapes, config.yaml's model section and tokenizer.json are written
together; an edited or mixed-up file would otherwise train (or generate) on happily with the
wrong model. Each check ends in one line naming the files that disagree.
"""
import dataclasses
import json
from pathlib import Path
from typing import Callable, List, Tuple

import torch
import yaml
from safetensors import SafetensorError, safe_open

from model import ModelConfig, Transformer
from training.checkpoint.errors import CheckpointError
from training.checkpoint.format import TIED_KEY, TOKENIZER, WEIGHTS, load_model_config, resolve_checkpoint
from training.checkpoint.manifest import format_version, refuse_newer_format
from training.checkpoint.manifest import verify as verify_files
from training.runtime.run_files import CONFIG, read_config

# Model fields a resumed run may change: they shape no weight and change no learned function.
RESUMABLE_CHANGES = ("dropout", "init_std", "max_seq_len")


def check_checkpoint_consistency(ckpt: Path) -> ModelConfig:
    """The checkpoint's model config, after checking model_config.json against the weights' shapes,
    config.yaml's model section and tokenizer.json's vocabulary. Reads headers, not the weights."""
    ckpt = Path(ckpt)
    cfg = load_model_config(ckpt)
    problems = _weights_vs_config(ckpt, cfg) + _yaml_vs_config(ckpt, cfg) + _tokenizer_vs_config(ckpt, cfg)
    if problems:
        raise CheckpointError(f"checkpoint {ckpt} contradicts itself: {'; '.join(problems)}; the files were edited "
                              "or come from different runs: restore them, or use another checkpoint")
    return cfg


def open_checkpoint(path: str, outputs_dir: str = "outputs", verify: bool = True,
                    warn: Callable[[str], None] = lambda message: None) -> Tuple[Path, ModelConfig]:
    """(checkpoint, its model config) for `path` (a checkpoint, a run dir, `latest`, `best`): its files verified
    against manifest.json unless `verify` is off, then checked against each other — what every loader does
    before it trusts anything (load_model, a resume, init_from). A later checkpoint format is refused first, verified
    or not: nothing here knows what its files mean."""
    ckpt = resolve_checkpoint(path, outputs_dir)
    if verify:
        verify_files(ckpt, warn=warn)  # a later format first (the manifest's tag), then bit rot, edits, missing files
    else:
        refuse_newer_format(ckpt, format_version(ckpt))  # the tag alone: nothing hashed
    return ckpt, check_checkpoint_consistency(ckpt)


def check_resume_fits(ckpt: Path, run_model: ModelConfig) -> None:
    """The resumed run must build the checkpoint's model (checked with the config, before any data is prepared)."""
    changed = architecture_changes(run_model, load_model_config(ckpt))
    if changed:
        raise CheckpointError(f"cannot resume {ckpt} with {', '.join(changed)}: a resumed run keeps the "
                              "checkpoint's architecture; drop those model.* overrides")


def architecture_changes(run_model: ModelConfig, ckpt_model: ModelConfig) -> List[str]:
    """`model.k=v (the checkpoint has k=w)` for each field of the run's model that would not fit the checkpoint's
    weights (RESUMABLE_CHANGES may differ)."""
    return [f"model.{k}={v} (the checkpoint has {k}={theirs})"
            for k, (v, theirs) in _differences(run_model, ckpt_model).items() if k not in RESUMABLE_CHANGES]


def check_resume_tokenizer(ckpt: Path, data_tokenizer: Path) -> None:
    """The resumed run must read the data with the checkpoint's tokenizer (checked once the data is prepared)."""
    if not same_json(Path(data_tokenizer), ckpt / TOKENIZER):
        raise CheckpointError(f"the data's tokenizer {data_tokenizer} differs from {ckpt}/tokenizer.json (the corpus "
                              "or data settings changed since that checkpoint); resume with the same data, or keep "
                              f"the checkpoint's tokenizer with data.tokenizer_path={ckpt}/tokenizer.json")


def _weights_vs_config(ckpt: Path, cfg: ModelConfig) -> List[str]:
    with torch.device("meta"):  # shapes only: no memory, no init
        expected = {k: tuple(v.shape) for k, v in Transformer(cfg).state_dict().items()}
    if cfg.tie_embeddings:
        expected.pop(TIED_KEY, None)
    try:
        with safe_open(str(ckpt / WEIGHTS), framework="pt") as f:
            found = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}
    except (OSError, SafetensorError) as e:
        raise CheckpointError(f"{ckpt}/model.safetensors is corrupt or unreadable ({e}); use another checkpoint")
    missing, unexpected = sorted(set(expected) - set(found)), sorted(set(found) - set(expected))
    if missing or unexpected:
        return [f"model.safetensors does not hold the tensors model_config.json describes "
                f"(missing {missing[:3]}, unexpected {unexpected[:3]})"]
    wrong = [k for k in expected if expected[k] != found[k]]
    if wrong:
        k = wrong[0]
        return [f"model_config.json ({_summary(cfg)}) does not match model.safetensors: {k} has shape "
                f"{found[k]}, the config needs {expected[k]} ({len(wrong)} tensors differ)"]
    return []


def _yaml_vs_config(ckpt: Path, cfg: ModelConfig) -> List[str]:
    try:
        saved = read_config(ckpt) if (ckpt / CONFIG).exists() else None
    except yaml.YAMLError as e:
        return [f"config.yaml is not valid YAML ({str(e).splitlines()[0]})"]
    section = saved.get("model") if isinstance(saved, dict) else None
    if not isinstance(section, dict):  # imported checkpoints carry no training config
        return []
    known = {f.name for f in dataclasses.fields(ModelConfig)}  # a field a later version dropped is no contradiction
    try:
        yaml_cfg = ModelConfig.from_dict({k: v for k, v in section.items() if k in known})
    except (TypeError, ValueError) as e:
        return [f"config.yaml's model section is invalid ({e})"]
    return [f"config.yaml says model.{k}={v}, model_config.json says {json_value}"
            for k, (v, json_value) in _differences(yaml_cfg, cfg).items()]


def _tokenizer_vs_config(ckpt: Path, cfg: ModelConfig) -> List[str]:
    from tokenizers import Tokenizer  # imported here: saving checkpoints does not need it

    try:
        vocab = Tokenizer.from_file(str(ckpt / TOKENIZER)).get_vocab(with_added_tokens=True)
    except Exception as e:  # tokenizers raises a bare Exception for unreadable files
        raise CheckpointError(f"{ckpt}/tokenizer.json is unreadable ({str(e).splitlines()[0]}); use another checkpoint")
    max_id = max(vocab.values(), default=-1)
    if max_id >= cfg.vocab_size:  # more rows than ids is fine (ids never produced); fewer is not
        return [f"tokenizer.json has token ids up to {max_id} but model_config.json says vocab_size={cfg.vocab_size}"]
    return []


def _differences(a: ModelConfig, b: ModelConfig) -> dict:
    """{field: (a's value, b's value)} for the fields that describe different networks. A derived size
    left unset equals the value it derives to (n_kv_heads=None is n_kv_heads=n_heads), and one that
    differs only because another field does (intermediate_size after hidden_size) is not repeated."""
    out = {}
    for name in (f.name for f in dataclasses.fields(ModelConfig)):
        left, right = getattr(a, name), getattr(b, name)
        resolved = f"resolved_{name}"
        if left == right or (hasattr(a, resolved) and getattr(a, resolved) == getattr(b, resolved)):
            continue
        out[name] = (left, right)
    return out


def _summary(cfg: ModelConfig) -> str:
    return f"hidden_size={cfg.hidden_size}, n_layers={cfg.n_layers}, vocab_size={cfg.vocab_size}"


def same_json(a: Path, b: Path) -> bool:
    """Same content, whatever the formatting (a copied file is byte-identical; a re-saved one may not be)."""
    try:
        first, second = a.read_bytes(), b.read_bytes()
        return first == second or json.loads(first) == json.loads(second)
    except (OSError, ValueError):
        return False
