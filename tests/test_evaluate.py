"""scripts/evaluate.py as a user runs it: every token scored once, equal to a float64 hand computation, on
text files, data configs, cache directories and HF directories; bad input is one error line."""

import json
import math
import re
from dataclasses import asdict

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from data import DataConfig, prepare
from scripts import evaluate as script
from tests import forked
from tests.tiny_checkpoint import (
    CORPUS,
    REPO,
    random_model,
    single_thread,  # noqa: F401 (autouse fixture)
    tiny_config,
    tiny_tokenizer,
)
from training.checkpoint import save_checkpoint, tokenizer_files

TOKENIZER = tiny_tokenizer()
EOS = TOKENIZER.token_to_id("<|eos|>")
SCRIPT = REPO / "scripts" / "evaluate.py"
DOCS = [
    "ROMEO: But, soft! what light through yonder window breaks?\nIt is the east.",
    "JULIET: O Romeo, Romeo! wherefore art thou Romeo? — naïve café 😀",
]


@pytest.fixture(scope="module")
def model():
    return random_model(tiny_config(TOKENIZER.get_vocab_size(), max_seq_len=16, init_std=0.3))


@pytest.fixture(scope="module")
def data(tmp_path_factory, model):
    """A local corpus prepared with the checkpoint's tokenizer, as a training run would."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "corpus.txt").write_text("\n\n".join(CORPUS[:40]))
    TOKENIZER.save(str(root / "tokenizer.json"))
    cfg = DataConfig(
        source="local",
        path=str(root / "corpus.txt"),
        tokenizer_path=str(root / "tokenizer.json"),
        cache_dir=str(root / "cache"),
        val_fraction=0.2,
    )
    return cfg, prepare(cfg, log=lambda *a: None)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, model, data):
    """A checkpoint whose config.yaml names that data, like every checkpoint train.py writes."""
    root = tmp_path_factory.mktemp("run")
    cfg, prepared = data
    return save_checkpoint(
        root / "checkpoints",
        10,
        model.state_dict(),
        model.cfg,
        tokenizer_files(prepared.tokenizer_path),
        state={"step": 10},
        config_yaml=OmegaConf.to_yaml({"data": asdict(cfg)}),
    )


def hand_nats(model, tokens, context, stride):
    """Σ -log p in float64 over stream [EOS] + tokens; token j sees the inputs of its window only."""
    model64 = random_model(model.cfg).double()
    model64.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
    stream = [EOS] + [int(t) for t in tokens]
    total = 0.0
    for j in range(1, len(stream)):
        start = max(0, math.ceil((j - context) / stride)) * stride
        with torch.no_grad():
            logits = model64(torch.tensor([stream[start:j]]))[0, -1]
        total -= torch.log_softmax(logits, dim=-1)[stream[j]].item()
    return total


def evaluate(tmp_path, capsys, *args):
    """Run the script's main() in this process (no interpreter + torch start per call): (JSON results, stdout, stderr)."""
    out = tmp_path / "result.json"
    assert script.main([*map(str, args), "--json", str(out), "--device", "cpu", "--dtype", "fp32"]) == 0
    stdout, stderr = capsys.readouterr()
    return json.loads(out.read_text()), stdout, stderr


@pytest.mark.parametrize("stride", [None, 16, 5])
def test_text_file_matches_a_float64_hand_computation(tmp_path, capsys, model, ckpt, stride):
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in DOCS))
    result, stdout, stderr = evaluate(
        tmp_path, capsys, ckpt, "--text", tmp_path / "docs.jsonl", *(["--stride", stride] if stride else [])
    )
    tokens = [t for d in DOCS for t in TOKENIZER.encode(d).ids + [EOS]]
    n_bytes = sum(len(d.encode("utf-8")) for d in DOCS)
    nats = hand_nats(model, tokens, 16, stride or 16)
    assert len(tokens) > 2 * 16  # several windows and a ragged tail
    assert (result["tokens"], result["bytes"]) == (len(tokens), n_bytes)
    assert result["loss"] == pytest.approx(nats / len(tokens), rel=1e-5)
    assert result["bits_per_byte"] == pytest.approx(nats / math.log(2) / n_bytes, rel=1e-5)
    assert f"{len(tokens):,} tokens, {n_bytes:,} bytes" in stdout and "bits per byte" in stdout
    assert "scoring" in stderr  # the progress bar


def test_stride_equal_to_context_is_the_default(tmp_path, capsys, ckpt):
    (tmp_path / "a.txt").write_text("\n\n".join(DOCS))
    default, _, _ = evaluate(tmp_path, capsys, ckpt, "--text", tmp_path / "a.txt", "--sample-by", "paragraph")
    tiled, _, _ = evaluate(
        tmp_path, capsys, ckpt, "--text", tmp_path / "a.txt", "--sample-by", "paragraph", "--stride", 16
    )
    assert default["loss"] == tiled["loss"] and default["tokens"] == tiled["tokens"]
    assert default["bytes"] == sum(len(d.encode()) for d in DOCS)  # paragraphs: the separators are not text


def test_training_data_split_by_default_by_cache_dir_and_by_name(tmp_path, capsys, model, ckpt, data):
    _, prepared = data
    meta = prepared.meta
    own, stdout, _ = evaluate(tmp_path, capsys, ckpt)  # the checkpoint's config.yaml data section
    cached, _, _ = evaluate(tmp_path, capsys, ckpt, "--data", prepared.dir)
    assert (own["tokens"], own["bytes"]) == (meta["val_tokens"], meta["val_bytes"])  # consistent with meta.json
    assert own["loss"] == cached["loss"]
    tokens = np.asarray(prepared.val_tokens())
    assert own["loss"] == pytest.approx(hand_nats(model, tokens, 16, 16) / len(tokens), rel=1e-5)
    train, _, _ = evaluate(tmp_path, capsys, ckpt, "--split", "train")
    assert (train["tokens"], train["bytes"]) == (meta["train_tokens"], meta["train_bytes"])


def test_data_config_with_another_tokenizer_is_retokenized_with_the_checkpoints(tmp_path, capsys, ckpt, data):
    """Same documents, a BPE the pipeline trains itself: scored with the checkpoint's tokenizer instead."""
    cfg, prepared = data
    other = {**asdict(cfg), "tokenizer_path": None, "vocab_size": 300}  # same size, other merges
    (tmp_path / "other.yaml").write_text(OmegaConf.to_yaml(other))
    result, _, stderr = evaluate(tmp_path, capsys, ckpt, "--data", tmp_path / "other.yaml")
    assert "re-tokenizing with the checkpoint's" in stderr
    assert (result["tokens"], result["bytes"]) == (prepared.meta["val_tokens"], prepared.meta["val_bytes"])


def test_hugging_face_directory_scores_like_the_checkpoint(tmp_path, capsys, ckpt):
    from interop.hf_export import export_checkpoint

    hf = export_checkpoint(str(ckpt), str(tmp_path / "hf"))
    (tmp_path / "a.txt").write_text(DOCS[0])
    ours, _, _ = evaluate(tmp_path, capsys, ckpt, "--text", tmp_path / "a.txt")
    theirs, _, stderr = evaluate(tmp_path, capsys, hf, "--text", tmp_path / "a.txt")
    assert "(Hugging Face)" in stderr
    assert theirs["tokens"] == ours["tokens"] and theirs["loss"] == pytest.approx(ours["loss"], rel=1e-6)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--stride", "17"], "--stride 17 must be between 1 and the context (16)"),
        (["--stride", "0"], "--stride 0 must be between 1 and the context (16)"),
        (["--context", "0"], "--context 0 must be between 1"),
        (["--text", "{tmp}/a.txt", "--split", "train"], "--set and --split apply to a data config"),
        (["--context", "32"], "--context 32 must be between 1 and the model's max_seq_len=16"),
        (["--text", "{tmp}/doc.pdf"], "doc.pdf: not a .txt, .md or .jsonl file; --text takes the files to score"),
        (["--text", "{tmp}/bad.jsonl"], "bad.jsonl:1 has no string field 'text'; set --text-column"),
        (["--text", "{tmp}/empty.txt"], "no non-empty document to score"),
        (
            ["--text", "{tmp}/latin1.txt"],
            "latin1.txt is not UTF-8 text (invalid continuation byte at byte 3); convert it to UTF-8",
        ),
        (["--data", "nonexistent"], "--data nonexistent: no such config or cache directory; use one of"),
        (["--set", "no_such_field=1"], "data config: Key 'no_such_field' not in 'DataConfig'"),
    ],
)
def test_bad_input_is_refused_naming_the_flag(tmp_path, ckpt, args, message):
    (tmp_path / "doc.pdf").write_text("x")
    (tmp_path / "a.txt").write_text("x")
    (tmp_path / "bad.jsonl").write_text('{"body": "x"}\n')
    (tmp_path / "empty.txt").write_text("  \n")
    (tmp_path / "latin1.txt").write_bytes("ROMÉO".encode("latin-1"))
    with pytest.raises(ValueError, match=re.escape(message)):
        script.main([str(ckpt), *[a.format(tmp=tmp_path) for a in args], "--device", "cpu"])


def test_checkpoint_without_training_config_is_one_error_line(tmp_path, model, data):
    """A real subprocess: the exit code and the one stderr line a user sees."""
    _, prepared = data
    bare = save_checkpoint(
        tmp_path / "checkpoints",
        1,
        model.state_dict(),
        model.cfg,
        tokenizer_files(prepared.tokenizer_path),
        state={"step": 1},
        config_yaml="# imported\n",
    )
    proc = forked.run_script(SCRIPT, bare, "--device", "cpu")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: {bare} has no training config with a data section; pass --data or --text"
    ]
