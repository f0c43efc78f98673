"""scripts/generate.py, export_hf.py, import_hf.py as a user runs them: output, batching, and bad input."""

import io
import json
import os
import shutil
import sys

import pytest
import torch

from data.tokenizer import SPECIAL_TOKENS
from model.generate import generate
from scripts import export_hf, import_hf
from scripts import generate as generate_program
from tests import forked
from tests.tiny_checkpoint import (
    REPO,
    random_model,
    single_thread,  # noqa: F401 (autouse fixture)
    tiny_config,
    tiny_tokenizer,
    write_checkpoint,
)
from training.program import exit_status

TOKENIZER = tiny_tokenizer()
GREEDY = ["--temperature", "0", "--max-new-tokens", "12", "--device", "cpu"]
PROGRAMS = {"generate.py": generate_program.main, "export_hf.py": export_hf.main, "import_hf.py": import_hf.main}


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model = random_model(tiny_config(TOKENIZER.get_vocab_size(), init_std=0.3))
    return model, write_checkpoint(tmp_path_factory.mktemp("gen") / "run", model, TOKENIZER)


def run_script(name, *args, stdin=None):
    """A real process (forked from a server that has imported torch): the exit code and stderr a user sees."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # tiny model: one thread is fastest on a busy machine
    return forked.run_script(REPO / "scripts" / name, *args, input=stdin, env=env)


def run_in_process(capsys, name, *args):
    """The program behind scripts/<name> in this process, through the scripts' exit-status wrapper (no ~3 s
    interpreter + torch start): (code, out, err)."""
    code = exit_status(PROGRAMS[name], [str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def expected(model, prompts, n=12):
    texts = generate(model, TOKENIZER, prompts, n, temperature=0, eos_token=SPECIAL_TOKENS["eos"])
    return [p + t for p, t in zip(prompts, texts)]


def test_generate_from_a_prompt_streams_the_greedy_continuation(checkpoint):
    model, ckpt = checkpoint
    proc = run_script("generate.py", ckpt.parent.parent, "--prompt", "ROMEO:", *GREEDY)  # a run dir
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected(model, ["ROMEO:"])[0] + "\n"
    assert "tokens/s" in proc.stderr and "Traceback" not in proc.stderr


def test_generate_batches_stdin_and_prompt_files(checkpoint, tmp_path):
    model, ckpt = checkpoint
    (tmp_path / "p.txt").write_text("JULIET: O Romeo\n")
    proc = run_script(
        "generate.py",
        ckpt,
        "-",
        "--prompt-file",
        tmp_path / "p.txt",
        "--prompt",
        "O",
        *GREEDY,
        stdin="But, soft!\nwhat light\n",
    )
    assert proc.returncode == 0, proc.stderr
    prompts = ["O", "JULIET: O Romeo", "But, soft!\nwhat light"]  # --prompt first, then files, then stdin
    blocks = [f"==== prompt {i + 1}, sample 1 ====\n{text}\n" for i, text in enumerate(expected(model, prompts))]
    assert proc.stdout == "".join(blocks)


def test_lines_mode_and_samples_in_process(checkpoint, tmp_path, capsys, monkeypatch):
    model, ckpt = checkpoint
    monkeypatch.setattr(sys, "stdin", io.StringIO("ROMEO:\n\nJULIET:\n"))
    code, out, _ = run_in_process(
        capsys, "generate.py", ckpt, "-", "--lines", "--num-samples", "2", "--seed", "1", "--max-new-tokens", "8"
    )
    assert code == 0
    assert out.count("==== prompt") == 4 and "prompt 2, sample 2" in out


def test_a_prompt_longer_than_the_context_is_refused_before_anything_is_printed(checkpoint, capsys):
    _, ckpt = checkpoint  # max_seq_len 64
    code, out, err = run_in_process(capsys, "generate.py", ckpt, "--prompt", "ROMEO: " * 60, "--max-new-tokens", "5")
    assert code == 1 and out == ""
    assert err.startswith("error: prompt 1 has ") and err.count("\n") == 1, err  # no note, no echo, no checkpoint line
    assert "but the model's context is 64 (model.max_seq_len), room for a prompt of at most 63; shorten it" in err


def test_a_prompt_file_that_is_not_utf8_is_named(checkpoint, tmp_path, capsys):
    _, ckpt = checkpoint
    (tmp_path / "latin1.txt").write_bytes("ROMÉO".encode("latin-1"))
    code, out, err = run_in_process(capsys, "generate.py", ckpt, "--prompt-file", tmp_path / "latin1.txt")
    assert code == 1 and err.strip() == (
        f"error: --prompt-file {tmp_path / 'latin1.txt'} is not UTF-8 text "
        "(invalid continuation byte at byte 3); convert it to UTF-8"
    )


def test_stdin_that_is_not_utf8_is_one_line(checkpoint, capsys, monkeypatch):
    import io

    _, ckpt = checkpoint
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO("ROMÉO".encode("latin-1")), encoding="utf-8"))
    code, out, err = run_in_process(capsys, "generate.py", ckpt, "-")
    assert (
        code == 1
        and out == ""
        and err.strip() == ("error: stdin is not UTF-8 text (invalid continuation byte at byte 3); pipe UTF-8 text")
    )


def test_generating_past_the_context_says_it_slides(checkpoint, capsys):
    model, ckpt = checkpoint  # max_seq_len 64
    code, out, err = run_in_process(
        capsys,
        "generate.py",
        ckpt,
        "--prompt",
        "ROMEO:",
        "--temperature",
        "0",
        "--max-new-tokens",
        "80",
        "--no-stop-at-eos",
    )
    assert code == 0 and "continues from the last 32 tokens" in err and "80 new tokens" in err
    assert out == "ROMEO:" + generate(model, TOKENIZER, ["ROMEO:"], 80, temperature=0, stop_at_eos=False)[0] + "\n"


def test_latest_finds_the_newest_checkpoint_under_outputs(checkpoint, tmp_path, capsys, monkeypatch):
    model, _ = checkpoint
    write_checkpoint(tmp_path / "outputs" / "old", random_model(model.cfg, seed=5), TOKENIZER)
    newest = write_checkpoint(tmp_path / "outputs" / "new", model, TOKENIZER)
    os.utime(newest / "state.json", (2e9, 2e9))  # "newest" by the mtime `latest` goes by, not by chance
    monkeypatch.chdir(tmp_path)
    code, out, err = run_in_process(capsys, "generate.py", "latest", "--prompt", "ROMEO:", *GREEDY)
    assert code == 0 and "outputs/new/checkpoints/step_0000010" in err and "12 new tokens" in err
    assert out == expected(model, ["ROMEO:"])[0] + "\n"


def _break_tokenizer_vocab(ckpt):
    tokenizer = tiny_tokenizer(vocab_size=340)  # ids up to 339: more than the model's 300 (320 padded)
    tokenizer.save(str(ckpt / "tokenizer.json"))


BAD_INPUTS = {  # name → (how to break a copy of the checkpoint, extra args, what the error must say)
    "not_a_checkpoint": (lambda c: [p.unlink() for p in c.iterdir()], [], "not a minillama checkpoint"),
    "missing_tokenizer": (lambda c: (c / "tokenizer.json").unlink(), [], "is damaged: tokenizer.json is missing"),
    "vocab_mismatch": (
        _break_tokenizer_vocab,
        ["--no-verify"],
        "vocab_size",
    ),  # past the manifest: the consistency check
    "replaced_tokenizer": (_break_tokenizer_vocab, [], "is damaged: tokenizer.json has"),  # the manifest sees it first
    "corrupt_weights": (
        lambda c: (c / "model.safetensors").write_bytes((c / "model.safetensors").read_bytes()[:500]),
        [],
        "corrupt",
    ),
    "unknown_device": (lambda c: None, ["--device", "tpu9"], "--device='tpu9' is not a device"),
    "unsupported_device": (lambda c: None, ["--device", "xpu"], "--device='xpu' is not supported"),
    "bad_temperature": (lambda c: None, ["--temperature", "-1"], "temperature"),
    "top_p_above_one": (lambda c: None, ["--top-p", "2"], "top_p=2.0 must be in (0, 1]"),  # not silently "off"
    "top_p_zero": (lambda c: None, ["--top-p", "0"], "top_p=0.0 must be in (0, 1]"),
    "no_prompt": (lambda c: None, [], "no prompt"),
    "seed_past_64_bits": (lambda c: None, ["--seed", "99999999999999999999"], "--seed 99999999999999999999 must be"),
    "negative_seed": (lambda c: None, ["--seed", "-1"], "--seed -1 must be an integer from 0 to 2**63 - 1"),
    "negative_new_tokens": (lambda c: None, ["--max-new-tokens", "-5"], "max_new_tokens=-5 must be >= 0"),
    "no_samples": (lambda c: None, ["--num-samples", "0"], "num_samples=0 must be >= 1"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_is_one_line_error_and_exit_1(checkpoint, tmp_path, capsys, case):
    breakage, extra, message = BAD_INPUTS[case]
    ckpt = shutil.copytree(checkpoint[1], tmp_path / "step_0000010")
    breakage(ckpt)
    prompt = [] if case == "no_prompt" else ["--prompt", "x"]
    code, out, err = run_in_process(capsys, "generate.py", ckpt, *prompt, *extra)
    assert code == 1 and out == ""
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_unavailable_cuda_is_a_clear_error_in_a_real_process(checkpoint):
    proc = run_script("generate.py", checkpoint[1], "--prompt", "x", "--device", "cuda")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("error: ") and "CUDA is not available" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_export_import_scripts_round_trip_to_the_same_generation(checkpoint, tmp_path, capsys):
    pytest.importorskip("transformers")
    model, ckpt = checkpoint
    code, out, err = run_in_process(capsys, "export_hf.py", ckpt, tmp_path / "hf")
    assert code == 0 and "from_pretrained" in out, err
    code, _, err = run_in_process(capsys, "export_hf.py", ckpt, tmp_path / "hf")
    assert code == 1 and "--force" in err and len(err.strip().splitlines()) == 1
    code, out, err = run_in_process(capsys, "import_hf.py", tmp_path / "hf", tmp_path / "imported")
    assert code == 0, err
    assert json.loads((tmp_path / "imported/checkpoints/step_0000000/state.json").read_text())["step"] == 0
    code, out, _ = run_in_process(capsys, "generate.py", tmp_path / "imported", "--prompt", "ROMEO:", *GREEDY)
    assert code == 0 and out == expected(model, ["ROMEO:"])[0] + "\n"
    code, _, err = run_in_process(capsys, "import_hf.py", tmp_path / "nothing_here", tmp_path / "x")
    assert code == 1 and err.startswith("error: ") and "config.json" in err
