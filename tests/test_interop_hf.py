"""Hugging Face interop: exported logits/greedy/tokens match transformers; import(export(x)) == x bitwise;
padded vocabularies (a 300-token tokenizer, 320 embedding rows) both ways; special tokens carried forward."""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from data.tokenizer import read_special_tokens
from interop.hf import ConversionError, import_checkpoint
from interop.hf_export import export_checkpoint
from model.generate import generate_ids
from tests.tiny_checkpoint import (
    random_model,
    single_thread,  # noqa: F401 (autouse fixture)
    tiny_config,
    tiny_tokenizer,
    write_checkpoint,
)
from training.checkpoint import load_model, load_model_config, save_checkpoint, tokenizer_files

transformers = pytest.importorskip("transformers")

TOKENIZER = tiny_tokenizer()
VOCAB = TOKENIZER.get_vocab_size()  # 300: not a multiple of 64, so every model here pads to 320 rows
CONFIGS = {  # GQA / MQA / MHA, non-default multiple_of and ffn multiplier, tied and untied, theta, eps
    "gqa_tied": dict(n_kv_heads=2, multiple_of=16),
    "mha_untied": dict(n_kv_heads=4, multiple_of=64, tie_embeddings=False, rope_theta=500.0, norm_eps=1e-6),
    "mqa_ffn_mult": dict(
        hidden_size=96,
        n_heads=6,
        n_kv_heads=1,
        multiple_of=48,
        ffn_dim_multiplier=1.3,
        max_seq_len=128,
        dropout=0.1,
        init_std=0.25,
    ),
}


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def exported(request, tmp_path_factory):
    """(our model in eval mode, its checkpoint dir, the HF export dir, the HF model)."""
    root = tmp_path_factory.mktemp(request.param)
    # init_std 0.3 (unless set): at 0.02 a random model's greedy output is one token repeated.
    model = random_model(tiny_config(VOCAB, **{"init_std": 0.3, **CONFIGS[request.param]}), seed=len(request.param))
    ckpt = write_checkpoint(root / "run", model, TOKENIZER)
    out = export_checkpoint(str(ckpt), str(root / "hf"))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    return model, ckpt, out, hf_model


def test_export_loads_as_llama_with_the_same_logits(exported):
    model, _, out, hf_model = exported
    assert type(hf_model).__name__ == "LlamaForCausalLM"
    hf_cfg, cfg = hf_model.config, model.cfg
    assert (hf_cfg.intermediate_size, hf_cfg.tie_word_embeddings, hf_cfg.rms_norm_eps, hf_cfg.num_key_value_heads) == (
        cfg.resolved_intermediate_size,
        cfg.tie_embeddings,
        cfg.norm_eps,
        cfg.resolved_n_kv_heads,
    )
    assert hf_cfg.rope_parameters["rope_theta"] == cfg.rope_theta
    # The padded embedding goes out whole: config vocab_size = rows, and the tokenizer has fewer tokens.
    assert hf_cfg.vocab_size == cfg.padded_vocab_size == 320
    assert len(transformers.AutoTokenizer.from_pretrained(out)) == VOCAB
    assert hf_model.get_input_embeddings().weight.shape[0] == 320
    assert hf_model.generation_config.suppress_tokens == list(range(VOCAB, 320))
    ids = torch.randint(0, VOCAB, (3, cfg.max_seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(ids), hf_model(ids).logits
    assert ours.shape[-1] == 320 and ours.abs().max() > 1e-2  # real logits, not an all-zero coincidence
    assert (ours - theirs).abs().max() <= 1e-4


def test_hf_greedy_generate_equals_ours(exported):
    model, _, _, hf_model = exported
    prompt = TOKENIZER.encode("ROMEO: But, soft!").ids
    theirs = hf_model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, len(prompt) :]
    ours = generate_ids(model, [prompt], 20, temperature=0, eos_id=TOKENIZER.token_to_id("<|eos|>"))[0]
    assert theirs.tolist() == ours
    assert len(set(ours)) > 3, "degenerate random model: the comparison would prove little"


def test_hf_generate_never_emits_a_padding_id_either(exported):
    model, _, _, hf_model = exported
    trap = torch.zeros(320)
    trap[VOCAB:] = 100.0  # every padding id far ahead: only the exported suppress_tokens stops them
    hook = hf_model.lm_head.register_forward_hook(lambda module, args, out: out + trap)
    try:
        prompt = torch.tensor([TOKENIZER.encode("ROMEO:").ids])
        with torch.no_grad():
            assert hf_model(prompt).logits.argmax(-1).min() >= VOCAB
        for kwargs in (dict(do_sample=False), dict(do_sample=True, top_k=0, top_p=1.0, temperature=1.0)):
            new = hf_model.generate(prompt, max_new_tokens=15, **kwargs)[0, prompt.shape[1] :]
            assert len(new) > 0 and new.max() < VOCAB
    finally:
        hook.remove()


def test_import_of_export_is_bitwise_identical(exported, tmp_path):
    model, ckpt, out, _ = exported
    back = import_checkpoint(str(out), str(tmp_path / "imported"))
    assert load_model_config(back) == model.cfg  # incl. multiple_of, ffn_dim_multiplier, dropout, init_std
    original, imported = load_file(str(ckpt / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert original.keys() == imported.keys()
    assert all(torch.equal(original[k], imported[k]) and original[k].dtype == imported[k].dtype for k in original)
    reloaded, tokenizer, _ = load_model(str(back))
    assert tokenizer.to_str() == TOKENIZER.to_str()
    assert json.loads((back / "state.json").read_text())["step"] == 0


@pytest.mark.parametrize("tie", [True, False])
def test_a_mup_model_exports_with_its_scales_folded_in_and_imports_back_as_that_sp_model(tmp_path, tie):
    cfg = tiny_config(VOCAB, init_std=0.5, parametrization="mup", mup_base_width=16, tie_embeddings=tie)  # m = 4
    model = random_model(cfg, seed=5)
    out = export_checkpoint(str(write_checkpoint(tmp_path / "run", model, TOKENIZER)), str(tmp_path / "hf"))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
    assert hf_model.config.tie_word_embeddings is False  # the multiplier is in the head, not the embedding
    imported, _, _ = load_model(str(import_checkpoint(str(out), str(tmp_path / "imported"))))
    assert imported.cfg == dataclasses.replace(cfg, parametrization="sp", tie_embeddings=False)
    ids = torch.randint(0, VOCAB, (3, cfg.max_seq_len), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = model(ids)
        assert (ours - hf_model(ids).logits).abs().max() <= 1e-4 and (ours - imported(ids)).abs().max() <= 1e-4
    prompt = TOKENIZER.encode("ROMEO: But, soft!").ids
    greedy = generate_ids(model, [prompt], 20, temperature=0)[0]
    assert len(set(greedy)) > 3, "degenerate random model: the comparison would prove little"
    assert (
        hf_model.generate(torch.tensor([prompt]), max_new_tokens=20, do_sample=False)[0, len(prompt) :].tolist()
        == greedy
        == generate_ids(imported, [prompt], 20, temperature=0)[0]
    )


def test_hf_tokenizer_encodes_like_ours(exported):
    _, _, out, _ = exported
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert (hf_tok.bos_token, hf_tok.eos_token, hf_tok.pad_token) == ("<|bos|>", "<|eos|>", "<|pad|>")
    assert (hf_tok.bos_token_id, hf_tok.eos_token_id, hf_tok.pad_token_id) == (0, 1, 2)
    for text in ["ROMEO: But, soft!", "  leading spaces\nand\ttabs", "héllo wörld 日本語 😀", "a<|eos|>b"]:
        ids = TOKENIZER.encode(text).ids
        assert hf_tok.encode(text) == ids
        assert hf_tok.decode(ids) == TOKENIZER.decode(ids, skip_special_tokens=False)


def test_import_of_a_model_saved_by_transformers_itself(tmp_path):
    """Not our export: a LlamaForCausalLM built and saved by HF, with a legacy top-level rope_theta."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=200,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=48,
        rms_norm_eps=1e-5,
        tie_word_embeddings=False,
        eos_token_id=1,
        bos_token_id=0,
    )
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(config).eval()
    hf_model.save_pretrained(tmp_path / "hf")
    cfg_path = tmp_path / "hf" / "config.json"
    raw = json.loads(cfg_path.read_text())
    raw["rope_theta"] = raw.pop("rope_parameters")["rope_theta"] * 3  # as pre-v5 configs write it
    cfg_path.write_text(json.dumps(raw))
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    TOKENIZER.save(str(tmp_path / "hf" / "tokenizer.json"))
    model, _, ckpt = load_model(str(import_checkpoint(str(tmp_path / "hf"), str(tmp_path / "run"))))
    assert model.cfg.rope_theta == 30000.0 and model.cfg.resolved_intermediate_size == 200
    assert model.cfg.padded_vocab_size == model.cfg.vocab_size == VOCAB
    ids = torch.randint(0, VOCAB, (2, 48), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert (model(ids) - hf_model(ids).logits).abs().max() <= 1e-4
    assert json.loads((ckpt / "special_tokens.json").read_text()) == {"bos": "<|bos|>", "eos": "<|eos|>", "pad": None}


def foreign_copy(out, directory):
    """A copy of our export without its manifest.json: a Hugging Face directory from elsewhere, which the
    tests below reshape or break (verification of our own exports: tests/test_checkpoint_trust.py)."""
    shutil.copytree(out, directory)
    (directory / "manifest.json").unlink()
    return directory


def test_sharded_weights_import_like_one_file(exported, tmp_path):
    model, ckpt, out, _ = exported
    sharded = foreign_copy(out, tmp_path / "sharded")
    weights = load_file(str(sharded / "model.safetensors"))
    (sharded / "model.safetensors").unlink()
    names = sorted(weights)
    halves = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in halves.items():
        save_file({k: weights[k] for k in keys}, str(sharded / file), metadata={"format": "pt"})
    weight_map = {k: file for file, keys in halves.items() for k in keys}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    back = import_checkpoint(str(sharded), str(tmp_path / "run"))
    original, imported = load_file(str(ckpt / "model.safetensors")), load_file(str(back / "model.safetensors"))
    assert all(torch.equal(original[k], imported[k]) for k in original)


@pytest.mark.parametrize("rows", [320, 333])  # padded to a multiple of 64, and to a row count no multiple explains
def test_import_of_an_hf_model_whose_embedding_exceeds_the_tokenizer(tmp_path, rows):
    """GPT-2-style HF checkpoints: config.json's vocab_size counts rows, the tokenizer has fewer tokens."""
    config = transformers.LlamaConfig(
        vocab_size=rows,
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
        eos_token_id=1,
        bos_token_id=0,
    )
    torch.manual_seed(0)
    hf_model = transformers.LlamaForCausalLM(config).eval()
    hf_model.save_pretrained(tmp_path / "hf")
    TOKENIZER.save(str(tmp_path / "hf" / "tokenizer.json"))
    model, _, _ = load_model(str(import_checkpoint(str(tmp_path / "hf"), str(tmp_path / "run"))))
    assert (model.cfg.vocab_size, model.cfg.padded_vocab_size) == (VOCAB, rows)
    ids = torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ours = model(ids)
        assert ours.shape[-1] == rows and (ours - hf_model(ids).logits).abs().max() <= 1e-4
    trap = torch.zeros(rows)
    trap[VOCAB:] = 100.0
    model.lm_head.register_forward_hook(lambda module, args, out: out + trap)
    assert max(generate_ids(model, [TOKENIZER.encode("ROMEO:").ids], 20, temperature=1.0, seed=0)[0]) < VOCAB


def test_import_refuses_a_tokenizer_larger_than_the_embedding(exported, tmp_path):
    _, _, out, _ = exported
    small = foreign_copy(out, tmp_path / "small")
    tiny_tokenizer(vocab_size=340).save(str(small / "tokenizer.json"))  # ids up to 339, rows 320
    with pytest.raises(ConversionError, match="token ids up to 339 .*only 320 rows"):
        import_checkpoint(str(small), str(tmp_path / "run"))


def test_imported_special_tokens_carry_forward_into_a_fine_tunes_checkpoints(tmp_path):
    """A fine-tune saves its checkpoints with the tokenizer it trains with — the imported one."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        max_position_embeddings=16,
        bos_token_id=None,
        eos_token_id=2,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path / "hf")
    TOKENIZER.save(str(tmp_path / "hf" / "tokenizer.json"))
    imported = import_checkpoint(str(tmp_path / "hf"), str(tmp_path / "run"))
    roles = read_special_tokens(imported)
    assert roles == {"bos": None, "eos": "<|pad|>", "pad": None}  # not minillama's defaults
    model, _, _ = load_model(str(imported))
    new = save_checkpoint(
        tmp_path / "finetune" / "checkpoints",
        5,
        model.state_dict(),
        model.cfg,
        tokenizer_files(imported / "tokenizer.json"),
        state={"step": 5},
    )
    assert read_special_tokens(new) == roles


@pytest.mark.parametrize(
    "norm,mlp,qk_norm",
    [
        ("layernorm", "swiglu", False),
        ("rmsnorm", "gelu", False),
        ("rmsnorm", "geglu", False),
        ("none", "swiglu", False),
        ("rmsnorm_bf16", "swiglu", False),
        ("rmsnorm", "swiglu", True),
    ],
)
def test_exporting_a_non_llama_variant_is_a_clear_error(tmp_path, norm, mlp, qk_norm):
    model = random_model(tiny_config(VOCAB, norm=norm, mlp=mlp, qk_norm=qk_norm))
    ckpt = write_checkpoint(tmp_path / "run", model, TOKENIZER)
    with pytest.raises(ConversionError, match="only rmsnorm \\+ swiglu models without qk_norm"):
        export_checkpoint(str(ckpt), str(tmp_path / "hf"))
    assert not (tmp_path / "hf").exists()


def test_export_refuses_a_non_empty_directory_unless_forced(exported, tmp_path):
    _, ckpt, _, _ = exported
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="--force"):
        export_checkpoint(str(ckpt), str(tmp_path / "hf"))
    export_checkpoint(str(ckpt), str(tmp_path / "hf"), force=True)
    assert (tmp_path / "hf" / "config.json").exists() and not (tmp_path / "hf" / "notes.txt").exists()


def _edit_config(directory, **changes):
    path = directory / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


@pytest.mark.parametrize(
    "breakage,match",
    [
        (lambda d: _edit_config(d, model_type="gpt2", architectures=["GPT2LMHeadModel"]), "only Llama"),
        (lambda d: _edit_config(d, rope_parameters={"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}), "RoPE"),
        (lambda d: _edit_config(d, attention_bias=True), "bias"),
        (lambda d: (d / "tokenizer.json").unlink(), "no tokenizer.json"),
        (lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"), "pickled"),
        (lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 16), "corrupt"),
        (lambda d: _edit_config(d, vocab_size=VOCAB + 1), "vocab_size|shape"),
        (lambda d: _edit_config(d, vocab_size=VOCAB - 1), "token ids up to 299"),
        (lambda d: (d / "config.json").unlink(), "not a Hugging Face model directory"),
    ],
)
def test_import_refuses_what_it_cannot_convert(exported, tmp_path, breakage, match):
    _, _, out, _ = exported
    broken = foreign_copy(out, tmp_path / "broken")
    breakage(broken)
    with pytest.raises(ConversionError, match=match):
        import_checkpoint(str(broken), str(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_the_weights_of_a_checkpoint_and_of_an_export_are_as_readable_as_any_file_written(exported):
    """safetensors writes 0600; an export meant for sharing, and the checkpoint it came from, follow the umask."""
    umask = os.umask(0)
    os.umask(umask)
    _, ckpt, out, _ = exported
    for weights in (ckpt / "model.safetensors", Path(out) / "model.safetensors"):
        assert oct(os.stat(weights).st_mode & 0o777) == oct(0o666 & ~umask), weights


def test_generate_takes_a_hugging_face_directory_as_evaluate_does(exported, capsys):
    """generate.py once called an HF directory "damaged"; now it imports it for the run, as evaluate.py does,
    and greedy text from the export is the checkpoint's."""
    from scripts.generate import main as generate_main

    _, ckpt, out, _ = exported
    texts = {}
    for name, path in (("ours", ckpt), ("hf", out)):
        assert generate_main([str(path), "--prompt", "the", "--max-new-tokens", "8", "--temperature", "0"]) == 0
        captured = capsys.readouterr()
        texts[name] = captured.out
        if name == "hf":
            assert f"checkpoint: {out} (Hugging Face)" in captured.err
    assert texts["hf"] == texts["ours"] and texts["ours"].startswith("the")
