"""training/checkpoint.py at its edges (the main paths are in test_checkpoint.py): the files as other
tools read them, every refusal's whole message, re-saving a step, a checkpoint written on a GPU, and
the generator states of a CUDA machine (CUDA's RNG calls replaced by recorders)."""

import io
import json
import os
import pickle
import zipfile

import pytest
import torch
from safetensors import safe_open

import training.checkpoint as C
from model import ModelConfig, Transformer
from tests.test_checkpoint import CFG, model_and_tokenizer, save, tokenizer_file  # noqa: F401 (fixture)
from training import one_line
from training.checkpoint import (
    TIED_KEY,
    CheckpointError,
    CheckpointWriteError,
    list_checkpoints,
    load_model,
    load_model_config,
    read_weights,
    resolve_checkpoint,
    restore_rng,
    rng_states_of_this_process,
    save_checkpoint,
    tokenizer_files,
)


@pytest.fixture
def model_and_path(tokenizer_file):  # noqa: F811
    return model_and_tokenizer(tokenizer_file)


def test_files_are_what_other_tools_and_people_read(tmp_path, model_and_path):
    model, path = model_and_path
    ckpt = save_checkpoint(tmp_path, 1, model.state_dict(), model.cfg, tokenizer_files(path), {"step": 1})
    with safe_open(str(ckpt / "model.safetensors"), framework="pt") as f:
        assert f.metadata() == {"format": "pt"}  # what transformers checks before it loads a safetensors file
    for name in ("model_config.json", "state.json"):  # `cat` shows one field per line, indented by 2
        text = (ckpt / name).read_text()
        assert text == json.dumps(json.loads(text), indent=2), name
    assert (ckpt / "config.yaml").read_text() == ""
    assert not (ckpt / "optimizer.pt").exists()  # no optimizer given: none written (an import, an export)
    assert json.loads((ckpt / "state.json").read_text()) == {"step": 1}  # the state given, as it was given


def test_three_checkpoints_are_kept_by_default(tmp_path, model_and_path):
    model, path = model_and_path
    for step in range(1, 6):
        save_checkpoint(tmp_path, step, model.state_dict(), model.cfg, tokenizer_files(path), {"step": step})
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_0000003", "step_0000004", "step_0000005"]


def test_a_tied_state_dict_without_the_head_saves_the_same(tmp_path, model_and_path):
    model, path = model_and_path
    weights = {k: v for k, v in model.state_dict().items() if k != TIED_KEY}
    ckpt = save_checkpoint(tmp_path, 1, weights, model.cfg, tokenizer_files(path), {"step": 1})
    assert set(read_weights(model, ckpt)) == set(model.state_dict())


def test_a_stale_tmp_from_a_crash_is_replaced_not_merged(tmp_path, model_and_path):
    model, path = model_and_path
    stale = tmp_path / "step_0000002.tmp"
    stale.mkdir()
    (stale / "junk.bin").write_bytes(b"left by a killed save")
    ckpt = save(tmp_path, 2, model, path)
    assert not (ckpt / "junk.bin").exists() and not stale.exists()


def test_resaving_a_step_replaces_it_and_leaves_no_old_copy(tmp_path, model_and_path):
    model, path = model_and_path
    root = tmp_path / "ck"
    save(root, 2, model, path)
    (root / "step_0000002.old").mkdir()  # left by a re-save that crashed before its cleanup
    (root / "step_0000002.old" / "state.json").write_text("{}")
    with torch.no_grad():
        model.norm.weight.fill_(3.0)
    ckpt = save(root, 2, model, path)
    assert torch.equal(read_weights(model, ckpt)["norm.weight"], model.norm.weight)
    assert sorted(p.name for p in root.iterdir()) == ["step_0000002"]


def test_a_failed_rename_puts_the_old_copy_back_and_names_the_checkpoint(tmp_path, model_and_path, monkeypatch):
    model, path = model_and_path
    root = tmp_path / "ck"
    first = save(root, 2, model, path)
    before = (first / "model.safetensors").read_bytes()
    real_replace = os.replace

    def refuse_publishing(src, dst):
        if str(src).endswith(".tmp"):
            raise PermissionError(13, "Permission denied", str(dst))
        real_replace(src, dst)

    monkeypatch.setattr(C.os, "replace", refuse_publishing)
    with torch.no_grad():
        model.norm.weight.fill_(3.0)
    with pytest.raises(CheckpointWriteError) as raised:
        save(root, 2, model, path)
    message = str(raised.value)
    assert message.startswith(f"cannot save checkpoint step_0000002: permission denied while writing {first}; "), (
        message
    )
    assert message.endswith(f"the last checkpoint, {first}, is intact"), message
    assert sorted(p.name for p in root.iterdir()) == ["step_0000002"]
    assert (first / "model.safetensors").read_bytes() == before


def test_a_leftover_that_cannot_be_deleted_does_not_fail_the_save(tmp_path, model_and_path, monkeypatch):
    """Deleting an old checkpoint or a replaced copy is housekeeping: the new checkpoint is complete, so a
    refused delete (here every rmdir) must not turn a good save into an error."""
    model, path = model_and_path
    for step in (1, 2):
        save(tmp_path, step, model, path, keep_last=1)
    monkeypatch.setattr(C.shutil.os, "rmdir", lambda *a, **k: (_ for _ in ()).throw(PermissionError(13, "denied")))
    assert save(tmp_path, 3, model, path, keep_last=1).name == "step_0000003"
    assert save(tmp_path, 3, model, path, keep_last=1).name == "step_0000003"  # a re-save: the .old stays behind


def test_resolve_refuses_with_the_whole_message(tmp_path, model_and_path, monkeypatch):
    model, path = model_and_path
    messages = {
        str(tmp_path / "nope"): f"{tmp_path / 'nope'} does not exist; pass a checkpoint directory, a run directory, "
        "'latest' or 'best'",
        str(tmp_path): f"{tmp_path} is not a minillama checkpoint (no manifest.json); pass a directory like "
        "outputs/<run>/checkpoints/step_0001000",
    }
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    (tmp_path / "killed").mkdir()  # killed before its first checkpoint: no checkpoints/ folder yet
    (tmp_path / "killed" / "config.yaml").write_text("seed: 0\n")
    for run in ("run", "killed"):
        messages[str(tmp_path / run)] = (
            f"run directory {tmp_path / run} has no complete checkpoint (it stopped "
            "before its first checkpoint was written): start the run again"
        )
    for given, message in messages.items():
        with pytest.raises(CheckpointError) as raised:
            resolve_checkpoint(given)
        assert str(raised.value) == message
    monkeypatch.chdir(tmp_path)  # 'latest' looks under ./outputs by default
    with pytest.raises(CheckpointError) as raised:
        resolve_checkpoint("latest")
    assert (
        str(raised.value) == "'latest' found no checkpoint under outputs/; train first or pass a checkpoint directory"
    )
    newer = save(tmp_path / "outputs" / "b" / "checkpoints", 1, model, path)
    newest = save(tmp_path / "outputs" / "a" / "checkpoints", 1, model, path)  # newest by time, not by name
    os.utime(newer / "state.json", (1, 1))
    assert resolve_checkpoint("latest").resolve() == newest


def test_an_invalid_model_config_is_refused_with_the_whole_message(tmp_path, model_and_path):
    model, path = model_and_path
    ckpt = save(tmp_path, 1, model, path)
    (ckpt / "model_config.json").write_text("[1]")
    with pytest.raises(CheckpointError) as raised:
        load_model_config(ckpt)
    assert str(raised.value).startswith(f"{ckpt}/model_config.json is unreadable or invalid (")
    assert str(raised.value).endswith("); the checkpoint is damaged")


def test_loading_refuses_with_the_whole_message(tmp_path, model_and_path):
    model, path = model_and_path
    ckpt = save(tmp_path, 1, model, path)
    saved = set(model.state_dict())
    for n_layers in (4, 1):  # only missing keys, then only unexpected ones: more than three each time
        other = Transformer(ModelConfig(**{**CFG, "vocab_size": model.cfg.vocab_size, "n_layers": n_layers}))
        with pytest.raises(CheckpointError) as raised:
            read_weights(other, ckpt)
        missing, unexpected = sorted(set(other.state_dict()) - saved), sorted(saved - set(other.state_dict()))
        assert len(missing + unexpected) > 3 and str(raised.value) == (
            f"checkpoint {ckpt} contradicts itself: model.safetensors does not hold what model_config.json "
            f"(hidden_size=32, n_layers={n_layers}, vocab_size={model.cfg.vocab_size}) describes: missing "
            f"{missing[:3]}, unexpected {unexpected[:3]}; the files were edited or come from different runs: restore "
            "them, or use another checkpoint"
        )
    wider = Transformer(ModelConfig(**{**CFG, "vocab_size": model.cfg.vocab_size + 64}))
    with pytest.raises(CheckpointError) as raised:
        read_weights(wider, ckpt)
    assert (
        f"describes: embed_tokens.weight has shape {(model.cfg.padded_vocab_size, 32)}, not "
        f"{(wider.cfg.padded_vocab_size, 32)};" in str(raised.value)
    )
    (ckpt / "model.safetensors").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError) as raised:
        read_weights(model, ckpt)
    assert str(raised.value).startswith(f"{ckpt}/model.safetensors is corrupt or unreadable (")
    assert str(raised.value).endswith("); use another checkpoint")


def test_load_model_puts_the_model_on_the_device_and_dtype_asked(tmp_path, model_and_path):
    model, path = model_and_path
    ckpt = save(tmp_path, 1, model, path)
    loaded, _, _ = load_model(str(ckpt), dtype=torch.bfloat16)
    assert {p.dtype for p in loaded.parameters()} == {torch.bfloat16} and not loaded.training
    loaded, _, _ = load_model(str(ckpt), device="meta")
    assert {p.device.type for p in loaded.parameters()} == {"meta"}
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


def written_on_a_gpu(obj) -> bytes:
    """torch.save's archive of `obj` with every storage's location rewritten from cpu to cuda:0."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    source, out = zipfile.ZipFile(io.BytesIO(buffer.getvalue())), io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for info in source.infolist():
            data = source.read(info.filename)
            if info.filename.endswith("data.pkl"):
                data = data.replace(b"X\x03\x00\x00\x00cpu", b"X\x06\x00\x00\x00cuda:0")
            archive.writestr(info, data)
    return out.getvalue()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the point is a machine without CUDA")
def test_a_checkpoint_written_on_a_gpu_resumes_on_a_cpu_only_machine(tmp_path, model_and_path):
    model, path = model_and_path
    ckpt = save(tmp_path, 1, model, path)
    (ckpt / "optimizer.pt").write_bytes(written_on_a_gpu({"state": {0: {"exp_avg": torch.ones(2)}}}))
    with pytest.raises(RuntimeError, match="CUDA"):  # what the file holds: CUDA storages
        torch.load(ckpt / "optimizer.pt", weights_only=True)
    assert C.safe_torch_load(ckpt / "optimizer.pt")["state"][0]["exp_avg"].device.type == "cpu"


def test_refused_and_damaged_files_have_one_whole_line(tmp_path, model_and_path, monkeypatch):
    model, path = model_and_path
    ckpt = save(tmp_path, 1, model, path)
    (ckpt / "state.json").write_text('{"step": 1,')
    with pytest.raises(CheckpointError) as raised:
        C.Resume.open(str(ckpt), verify=False)
    assert str(raised.value) == (
        f"{ckpt}/state.json is unreadable (Expecting property name enclosed in double "
        "quotes: line 1 column 12 (char 11)); resume from an older checkpoint"
    )
    # A refused pickle whose message names no global: the same advice, without a name in parentheses.
    monkeypatch.setattr(C.torch, "load", lambda *a, **k: (_ for _ in ()).throw(pickle.UnpicklingError("bad opcode")))
    with pytest.raises(CheckpointError) as raised:
        C.safe_torch_load(ckpt / "rng.pt")
    assert str(raised.value) == (
        f"{ckpt / 'rng.pt'} holds Python objects that minillama never writes, so it was "
        "refused unread: the file was tampered with or comes from elsewhere; do not use "
        "this checkpoint, resume from another one"
    )


def test_one_line_of_an_error_is_never_empty_and_cut_where_asked():
    assert one_line(RuntimeError("")) == "RuntimeError"
    assert one_line(RuntimeError("  first\nsecond")) == "first"
    assert one_line(RuntimeError("x" * 500), 200) == "x" * 200 and one_line(RuntimeError("x" * 500)) == "x" * 500
    assert one_line(RuntimeError(""), typed=True) == "RuntimeError"
    assert one_line(RuntimeError("bad\nmore"), 2, typed=True) == "RuntimeError: ba"


class FakeCuda:
    """torch.cuda's RNG calls on a machine with 'two GPUs', recorded."""

    def __init__(self):
        self.states = [torch.tensor([1, 2], dtype=torch.uint8), torch.tensor([3, 4], dtype=torch.uint8)]
        self.restored = []

    def install(self, monkeypatch):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: list(self.states))
        monkeypatch.setattr(torch.cuda, "set_rng_state_all", self.restored.append)


def test_a_cuda_machine_saves_and_restores_every_gpus_generator(monkeypatch):
    cuda = FakeCuda()
    cuda.install(monkeypatch)
    saved = rng_states_of_this_process()
    assert set(saved) == {"torch", "cuda"} and saved["cuda"] == cuda.states
    assert restore_rng(saved) is True and cuda.restored == [cuda.states]
    assert restore_rng({"torch": saved["torch"]}) is True  # a checkpoint from a CPU machine: CPU state only
    assert cuda.restored == [cuda.states]


def test_a_cpu_machine_ignores_a_checkpoints_cuda_states(monkeypatch):
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("no CUDA here"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert restore_rng({"torch": torch.get_rng_state(), "cuda": [torch.zeros(2, dtype=torch.uint8)]}) is True


def test_a_one_process_checkpoint_with_per_rank_states_restores_with_the_defaults():
    torch.manual_seed(5)
    saved = {"ranks": [rng_states_of_this_process()]}
    expected = torch.rand(2)
    torch.manual_seed(0)
    assert restore_rng(saved) is True and torch.equal(torch.rand(2), expected)
