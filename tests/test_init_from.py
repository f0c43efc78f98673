"""`init_from=`: a new run that starts from the weights of a minillama checkpoint or a Hugging Face Llama
directory — its own data, optimizer, schedule and run directory, the checkpoint's architecture and tokenizer
(docs/training.md, "Starting from weights")."""

import random

import pytest
import torch

from model import Transformer
from scripts import export_hf
from tests.train_helpers import read_metrics, run_train, train_in_process
from training.checkpoint import CheckpointError, InitFrom, load_model
from training.cli import ConfigError, resolve_config
from training.program import compose, compose_run_config, exit_status

pytestmark = pytest.mark.serial  # trains

WORDS = (
    "the cat sat on a mat and then the dog ran to the park where children play with a red ball every day "
    "while birds sing in tall green trees"
).split()


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tiny_data_cache):
    """A tiny run pretrained on Shakespeare (60 steps): its run directory."""
    run = tmp_path_factory.mktemp("pretrained") / "run"
    train_in_process(
        run, "trainer.max_steps=60", "trainer.eval_interval=60", "trainer.ckpt_interval=60", cache_dir=tiny_data_cache
    )
    return run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A second corpus: plain English sentences, nothing like Shakespeare's verse layout."""
    rng = random.Random(0)
    path = tmp_path_factory.mktemp("corpus") / "b.txt"
    path.write_text("\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(3000)))
    return path


def on_corpus(corpus) -> list:
    return ["data=local", f"data.path={corpus}", "data.sample_by=line"]


def test_a_pretrained_run_continues_on_a_second_corpus(pretrained, corpus, tmp_path, tiny_data_cache):
    """The loss on the new corpus starts far below a fresh model's (the weights were loaded) and falls below
    where it started; the run is new: step 0, its own run directory, the pretrained tokenizer."""
    common = [
        *on_corpus(corpus),
        "trainer.max_steps=30",
        "trainer.log_interval=1",
        "trainer.eval_interval=30",
        "trainer.ckpt_interval=30",
    ]
    tuned = run_train(
        tmp_path, f"init_from={pretrained}", *common, f"hydra.run.dir={tmp_path / 'tuned'}", cache_dir=tiny_data_cache
    )
    source = pretrained / "checkpoints" / "step_0000060"
    assert f"weights: from {pretrained} → {source} (its step 60); a new run from step 0" in tuned.stdout
    scratch = run_train(
        tmp_path,
        *common,
        f"data.tokenizer_path={source / 'tokenizer.json'}",
        f"hydra.run.dir={tmp_path / 'scratch'}",
        cache_dir=tiny_data_cache,
    )
    assert "weights: from" not in scratch.stdout
    rows = {name: read_metrics(tmp_path / name) for name in ("tuned", "scratch")}
    first = {name: next(r["loss"] for r in rows[name] if r.get("kind") == "train") for name in rows}
    final = next(r["val_loss"] for r in reversed(rows["tuned"]) if r.get("kind") == "eval")
    assert first["tuned"] < first["scratch"] - 0.5, first  # started from the pretrained weights
    assert final < first["tuned"], (final, first)  # and learned the new corpus
    assert (tmp_path / "tuned" / "checkpoints" / "step_0000030").is_dir()
    assert sorted(p.name for p in (pretrained / "checkpoints").iterdir()) == ["best", "step_0000060"]  # untouched
    # The new run resumes as any run does: from its own checkpoint, its data read with the carried tokenizer.
    resumed = run_train(tmp_path, f"resume={tmp_path / 'tuned'}", "trainer.max_steps=34", cache_dir=tiny_data_cache)
    assert "weights: from" not in resumed.stdout and (tmp_path / "tuned" / "checkpoints" / "step_0000034").is_dir()


def test_a_fine_tuned_hugging_face_model_exports_back_with_parity(pretrained, tmp_path, tiny_data_cache):
    """Export → init_from=<HF dir> (imported once into the data cache) → train → export: the second export's
    logits in transformers equal the fine-tuned checkpoint's."""
    transformers = pytest.importorskip("transformers")
    assert exit_status(export_hf.main, [str(pretrained), str(tmp_path / "hf")]) == 0
    proc = run_train(
        tmp_path,
        f"init_from={tmp_path / 'hf'}",
        "trainer.max_steps=6",
        "trainer.eval_interval=6",
        f"hydra.run.dir={tmp_path / 'tuned'}",
        cache_dir=tiny_data_cache,
    )
    assert f"weights: from {tmp_path / 'hf'} → " in proc.stdout and "/imported/" in proc.stdout
    tuned = tmp_path / "tuned" / "checkpoints" / "step_0000006"
    assert exit_status(export_hf.main, [str(tuned), str(tmp_path / "hf2")]) == 0
    model, _, _ = load_model(str(tuned))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf2").eval()
    ids = torch.randint(0, 512, (2, 32), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(ids), hf_model(ids).logits
    assert (ours - theirs).abs().max() <= 1e-4
    start, _, _ = load_model(str(pretrained))
    with torch.no_grad():
        assert (start(ids) - ours).abs().max() > 1e-3  # it trained: not the imported weights again


def test_the_model_and_tokenizer_come_from_the_checkpoint(pretrained):
    """The composed model group is replaced by the checkpoint's architecture; model.* may change what shapes no
    weight; data.tokenizer_path becomes a copy of the checkpoint's tokenizer in the data cache."""
    cfg = compose_run_config(["debug=tiny", "model=25m", f"init_from={pretrained}", "model.dropout=0.1"])
    assert (cfg.model.hidden_size, cfg.model.n_layers, cfg.model.dropout) == (64, 2, 0.1)
    carried = cfg.data.tokenizer_path
    assert "/tokenizers/" in carried
    assert open(carried).read() == (pretrained / "checkpoints" / "step_0000060" / "tokenizer.json").read_text()


@pytest.mark.parametrize(
    "overrides,message",
    [
        (
            ["model.hidden_size=128"],
            "cannot start from {ckpt} with model.hidden_size=128 (the checkpoint has "
            "hidden_size=64): init_from keeps the checkpoint's architecture",
        ),
        (
            ["resume={run}"],
            "resume= continues a run and init_from= starts a new one from a checkpoint's weights; pass one of them",
        ),
    ],
)
def test_what_a_start_from_weights_cannot_change_is_one_line(pretrained, overrides, message):
    ckpt = pretrained / "checkpoints" / "step_0000060"
    overrides = [o.format(run=pretrained) for o in overrides]
    with pytest.raises(ValueError) as e:
        compose_run_config(["debug=tiny", f"init_from={pretrained}", *overrides])
    assert str(e.value).startswith(message.format(ckpt=ckpt)), str(e.value)


def test_another_vocabulary_is_refused_and_the_config_records_the_checkpoints(pretrained):
    """The tokenizer comes with the weights: a typed data.vocab_size that differs is one line (it trained with the
    checkpoint's while config.yaml recorded the typed one); without it, the config holds the real size."""
    cfg = compose_run_config(["debug=tiny", f"init_from={pretrained}", "data.vocab_size=1024"][:2])
    vocab = cfg.data.vocab_size
    assert vocab == cfg.model.vocab_size
    assert (
        compose_run_config(["debug=tiny", f"init_from={pretrained}", f"data.vocab_size={vocab}"]).data.vocab_size
        == vocab
    )
    with pytest.raises(ConfigError) as e:
        compose_run_config(["debug=tiny", f"init_from={pretrained}", f"data.vocab_size={2 * vocab}"])
    assert str(e.value) == (
        f"init_from={pretrained} keeps its {vocab}-token tokenizer (the weights read its ids), so "
        f"data.vocab_size={2 * vocab} cannot apply; drop it, or train from scratch for another vocabulary"
    )


def test_another_tokenizer_is_refused(pretrained, tmp_path):
    from tests.tiny_checkpoint import tiny_tokenizer

    other = tmp_path / "tokenizer.json"
    tiny_tokenizer().save(str(other))
    with pytest.raises(CheckpointError, match=r"data.tokenizer_path=.* is not the tokenizer of .*; drop "):
        compose_run_config(["debug=tiny", f"init_from={pretrained}", f"data.tokenizer_path={other}"])


def test_a_mup_checkpoint_starts_a_mup_run_with_the_same_function(tmp_path, tiny_data_cache):
    """μP's multipliers live in the model config, not the weights: the new run builds the checkpoint's μP model,
    whose logits equal the checkpoint's before any step."""
    run = tmp_path / "mup"
    train_in_process(
        run,
        "model.parametrization=mup",
        "model.mup_base_width=32",
        "trainer.max_steps=4",
        "trainer.eval_interval=4",
        "trainer.ckpt_interval=4",
        cache_dir=tiny_data_cache,
    )
    cfg = compose_run_config(["debug=tiny", f"init_from={run}"])
    assert (cfg.model.parametrization, cfg.model.mup_base_width) == ("mup", 32)
    init = InitFrom.open(str(run))
    model = Transformer(cfg.model).eval()
    init.load(model)
    saved, _, _ = load_model(str(run))
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids), saved(ids))


def test_resolve_config_returns_the_start(pretrained):
    resolved = resolve_config(compose(["debug=tiny", f"init_from={pretrained}"]))
    assert resolved.resume is None and resolved.init.path == pretrained / "checkpoints" / "step_0000060"
    with pytest.raises(ConfigError):
        resolve_config(compose(["debug=tiny", f"init_from={pretrained}", f"resume={pretrained}"]))


def test_a_missing_source_is_one_line_naming_what_init_from_takes():
    with pytest.raises(
        CheckpointError,
        match=r"^init_from=/nonexistent does not exist; pass a checkpoint directory, a "
        r"run directory, 'latest', 'best' or a Hugging Face Llama directory$",
    ):
        compose_run_config(["debug=tiny", "init_from=/nonexistent"])
