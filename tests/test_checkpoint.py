"""Checkpoint directories: atomic writes (interrupted for real), an exact resume of weights and optimizer
moments, no NaN checkpoints, pruning, `latest`, strict and safe loading."""

import json
import os

import pytest
import torch

import training.checkpoint
from model import ModelConfig, Transformer
from training.checkpoint import (
    CheckpointError,
    NonFiniteCheckpoint,
    clean_partial_checkpoints,
    full_optimizer_state,
    last_good_checkpoint,
    list_checkpoints,
    load_full_state,
    load_model,
    read_state,
    read_weights,
    resolve_checkpoint,
    restore_rng,
    rng_states_of_this_process,
    safe_torch_load,
    save_checkpoint,
    tokenizer_files,
)

CFG = dict(vocab_size=300, hidden_size=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


@pytest.fixture
def tokenizer_file(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(
        ["hello world"] * 10,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<|bos|>", "<|eos|>", "<|pad|>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path, tok.get_vocab_size()


def save(root, step, model, tokenizer_path, **kw):
    opt = torch.optim.AdamW(model.parameters())
    return save_checkpoint(
        root,
        step,
        model.state_dict(),
        model.cfg,
        tokenizer_files(tokenizer_path),
        {"step": step, "tokens_seen": 0, "elapsed_before": 0.0},
        "a: 1\n",
        opt.state_dict(),
        **kw,
    )


def test_roundtrip_is_exact_and_head_stays_tied(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    ckpt = save(tmp_path / "ckpts", 5, model, path)
    loaded, tok, where = load_model(str(ckpt))
    assert where == ckpt and tok.get_vocab_size() == vocab
    for (n, p), q in zip(model.state_dict().items(), loaded.state_dict().values()):
        assert torch.equal(p, q), n
    assert loaded.lm_head.weight.data_ptr() == loaded.embed_tokens.weight.data_ptr()
    state, opt, rng = read_state(ckpt), safe_torch_load(ckpt / "optimizer.pt"), safe_torch_load(ckpt / "rng.pt")
    assert state["step"] == 5 and "torch" in rng and opt is not None


def adamw_steps(model, optimizer, n, seed):
    batches = torch.randint(0, model.cfg.vocab_size, (n, 2, 9), generator=torch.Generator().manual_seed(seed))
    for batch in batches:
        logits = model(batch[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


def test_a_resumed_model_and_optimizer_continue_exactly_as_if_never_saved(tmp_path, tokenizer_file):
    """Train 3 AdamW steps, save (moments, step counts, per-group lr), then 2 more; a fresh model and
    optimizer loaded from the checkpoint take the same 2 steps to the same bits."""
    model, path = model_and_tokenizer(tokenizer_file)
    optimizer = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if "norm" in n], "lr": 2e-3},
            {"params": [p for n, p in model.named_parameters() if "norm" not in n]},
        ],
        lr=1e-2,
        weight_decay=0.1,
    )
    adamw_steps(model, optimizer, 3, seed=0)
    ckpt = save_checkpoint(
        tmp_path,
        3,
        model.state_dict(),
        model.cfg,
        tokenizer_files(path),
        {"step": 3},
        "",
        full_optimizer_state(model, [optimizer]),
    )
    adamw_steps(model, optimizer, 2, seed=1)

    torch.manual_seed(123)  # another init: everything must come from the checkpoint
    fresh, _ = model_and_tokenizer(tokenizer_file)
    fresh_opt = torch.optim.AdamW(
        [
            {"params": [p for n, p in fresh.named_parameters() if "norm" in n], "lr": 0.5},
            {"params": [p for n, p in fresh.named_parameters() if "norm" not in n]},
        ],
        lr=0.5,
        weight_decay=0.1,
    )
    optim_state = safe_torch_load(ckpt / "optimizer.pt")
    assert len(optim_state["state"]) == len(list(model.parameters()))  # moments of every parameter were saved
    load_full_state(fresh, [fresh_opt], read_weights(fresh, ckpt), optim_state)
    assert [g["lr"] for g in fresh_opt.param_groups] == [2e-3, 1e-2]
    adamw_steps(fresh, fresh_opt, 2, seed=1)
    for (name, p), q in zip(model.named_parameters(), fresh.parameters()):
        assert torch.equal(p, q), name
    assert fresh.lm_head.weight is fresh.embed_tokens.weight


class Interrupted(BaseException):
    """What a kill looks like to the code being killed: no `except Exception` catches it."""


@pytest.mark.parametrize("after", ["model.safetensors", "optimizer.pt", "rng.pt"])
@pytest.mark.parametrize("resave", [False, True], ids=["new-step", "same-step-again"])
def test_an_interrupted_save_never_touches_a_complete_checkpoint(tmp_path, tokenizer_file, monkeypatch, after, resave):
    """A real save stopped right after writing `after`: the checkpoints that were complete stay complete
    and unchanged (a re-save of the same step too: e.g. `best`), and the next start's sweep leaves exactly
    them. Writing in place instead of into step_N.tmp would leave a half-new step_N that looks complete."""
    model, path = model_and_tokenizer(tokenizer_file)
    root = tmp_path / "checkpoints"  # beside the tokenizer file, not around it
    first = save(root, 1, model, path)
    before = {f.name: f.read_bytes() for f in first.iterdir()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the new save would write other weights
    step, real = 1 if resave else 2, training.checkpoint.write_file

    def write_then_die(target, data):
        real(target, data)
        if os.path.basename(str(target)) == after:
            raise Interrupted

    monkeypatch.setattr(training.checkpoint, "write_file", write_then_die)
    with pytest.raises(Interrupted):
        save(root, step, model, path)
    monkeypatch.undo()
    assert list_checkpoints(root) == [first] and resolve_checkpoint(str(root)) == first
    assert {f.name: f.read_bytes() for f in first.iterdir()} == before
    assert clean_partial_checkpoints(root) == [root / f"step_{step:07d}.tmp"]
    assert sorted(p.name for p in root.iterdir()) == ["step_0000001"]
    assert {f.name: f.read_bytes() for f in first.iterdir()} == before


def test_prune_keeps_last_k_and_ignores_half_written(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    for step in (1, 2, 3, 4):
        save(tmp_path, step, model, path, keep_last=2)
    (tmp_path / "step_0000009.tmp").mkdir()  # a crash mid-save
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003", "step_0000004"]
    assert resolve_checkpoint(str(tmp_path)).name == "step_0000004"


def test_latest_finds_the_newest_checkpoint(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    save(tmp_path / "outputs" / "a" / "checkpoints", 7, model, path)
    newest = save(tmp_path / "outputs" / "b" / "checkpoints", 3, model, path)
    assert resolve_checkpoint("latest", str(tmp_path / "outputs")) == newest
    assert resolve_checkpoint(str(tmp_path / "outputs" / "b")) == newest  # a run dir
    with pytest.raises(CheckpointError, match="found no checkpoint"):
        resolve_checkpoint("latest", str(tmp_path / "nothing"))


def test_bad_checkpoints_raise_clear_errors(tmp_path, tokenizer_file):
    path, vocab = tokenizer_file
    model = Transformer(ModelConfig(**{**CFG, "vocab_size": vocab}))
    ckpt = save(tmp_path / "ck", 1, model, path)
    with pytest.raises(CheckpointError, match="not a minillama checkpoint"):
        resolve_checkpoint(str(path.parent))  # a directory, but no checkpoint
    cfg = json.loads((ckpt / "model_config.json").read_text())
    (ckpt / "model_config.json").write_text(json.dumps({**cfg, "vocab_size": vocab - 1}))
    with pytest.raises(CheckpointError, match=r"is damaged: model_config.json has \d+ bytes, the manifest says"):
        load_model(str(ckpt))
    # Unverified (--no-verify), the checks of the files against each other still refuse it.
    with pytest.raises(CheckpointError, match=f"tokenizer.json has token ids up to {vocab - 1}"):
        load_model(str(ckpt), verify=False)
    (ckpt / "model_config.json").write_text(json.dumps({**cfg, "hidden_size": 64}))
    with pytest.raises(CheckpointError, match="shape"):
        load_model(str(ckpt), verify=False)
    (ckpt / "model_config.json").write_text(json.dumps(cfg))
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="corrupt"):
        load_model(str(ckpt), verify=False)


def model_and_tokenizer(tokenizer_file):
    path, vocab = tokenizer_file
    return Transformer(ModelConfig(**{**CFG, "vocab_size": vocab})), path


def test_non_finite_weights_or_optimizer_state_are_never_written(tmp_path, tokenizer_file):
    root = tmp_path / "ck"
    model, path = model_and_tokenizer(tokenizer_file)
    with torch.no_grad():
        model.layers[1].mlp.down_proj.weight[0, 0] = float("nan")
    with pytest.raises(
        NonFiniteCheckpoint,
        match=r"refusing to save step 1: 1 of \d+ weight tensors hold NaN or inf \(first: layers.1.mlp.down_proj.weight\)",
    ):
        save(root, 1, model, path)
    assert not root.exists()  # not even a .tmp
    good, path = model_and_tokenizer(tokenizer_file)
    save(root, 2, good, path)
    opt = torch.optim.AdamW(good.parameters())
    good(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    opt.step()
    opt.state[good.norm.weight]["exp_avg_sq"][0] = float("inf")  # finite weights, poisoned moments
    poisoned = r"the optimizer state holds NaN or inf \(first: optimizer\.state\.\d+\.exp_avg_sq\)"
    with pytest.raises(NonFiniteCheckpoint, match=poisoned):
        save_checkpoint(root, 4, good.state_dict(), good.cfg, tokenizer_files(path), {"step": 4}, "", opt.state_dict())
    assert [p.name for p in root.iterdir()] == ["step_0000002"]


def test_the_last_good_checkpoint_is_the_newest_whose_files_match_their_manifest(tmp_path, tokenizer_file):
    """What a message names when a run cannot go on: found when the message is printed (it hashes), never sooner."""
    model, path = model_and_tokenizer(tokenizer_file)
    steps = [save(tmp_path, step, model, path, keep_last=0) for step in (1, 2, 3)]
    assert last_good_checkpoint(tmp_path) == steps[2]
    (steps[2] / "rng.pt").write_bytes(b"bit rot")
    assert last_good_checkpoint(tmp_path) == steps[1]
    (steps[1] / "manifest.json").unlink()
    assert last_good_checkpoint(tmp_path) == steps[0] and last_good_checkpoint(tmp_path / "missing") is None


def test_checkpoints_sort_by_step_number_not_by_name(tmp_path, tokenizer_file):
    model, path = model_and_tokenizer(tokenizer_file)
    for step in (9_999_999, 10_000_000):
        save(tmp_path, step, model, path)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_9999999", "step_10000000"]
    assert resolve_checkpoint(str(tmp_path)).name == "step_10000000"


class Payload:
    """A pickle that runs a shell command when it is unpickled by the unsafe loader."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("victim", ["optimizer.pt", "rng.pt"])
def test_malicious_pickles_are_refused_in_one_line(tmp_path, tokenizer_file, victim):
    model, path = model_and_tokenizer(tokenizer_file)
    ckpt = save(tmp_path, 1, model, path)
    marker = tmp_path / "pwned"
    torch.save({"state": Payload(marker)}, ckpt / victim)
    with pytest.raises(CheckpointError) as refused:
        safe_torch_load(ckpt / victim)
    message = str(refused.value)
    assert message.startswith(f"{ckpt / victim} holds Python objects (posix.system) that minillama never writes")
    assert "\n" not in message and "weights_only" not in message and "resume from another one" in message
    assert not marker.exists()


def test_damaged_training_state_files_name_the_file(tmp_path, tokenizer_file):
    model, path = model_and_tokenizer(tokenizer_file)
    ckpt = save(tmp_path, 1, model, path)
    (ckpt / "optimizer.pt").write_bytes((ckpt / "optimizer.pt").read_bytes()[:100])
    with pytest.raises(
        CheckpointError,
        match=r"optimizer.pt is truncated or corrupt \(PytorchStreamReader failed "
        r"reading zip archive: failed finding central directory\); resume from an older checkpoint$",
    ):
        safe_torch_load(ckpt / "optimizer.pt")
    (ckpt / "rng.pt").unlink()
    with pytest.raises(CheckpointError, match=r"rng.pt is missing; the checkpoint is incomplete"):
        safe_torch_load(ckpt / "rng.pt")


def test_restore_rng_gives_each_rank_its_own_state_and_refuses_a_foreign_world_size():
    states = []
    for seed in (1, 2):  # what two ranks saved
        torch.manual_seed(seed)
        states.append(rng_states_of_this_process())
    draws = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        draws.append(torch.rand(3))
    saved = {"ranks": states}
    for rank in (0, 1):
        torch.manual_seed(99)
        assert restore_rng(saved, rank, 2) is True
        assert torch.equal(torch.rand(3), draws[rank])
    torch.manual_seed(99)
    expected = torch.rand(3)
    for rank, world_size in ((0, 1), (0, 3), (1, 1)):  # another world size: the caller's seeding stands
        torch.manual_seed(99)
        assert restore_rng(saved, rank, world_size) is False
        assert torch.equal(torch.rand(3), expected)
    torch.manual_seed(99)  # an old single-process checkpoint (no "ranks"): rank 0 of one process only
    assert restore_rng(states[1]) is True and torch.equal(torch.rand(3), draws[1])
    assert restore_rng(states[1], 1, 2) is False
