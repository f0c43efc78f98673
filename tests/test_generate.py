"""Generation: KV-cache == recompute on every variant, what the cache feeds, batching, EOS, overflow, streaming,
and padding ids of a padded vocabulary never generated. The filters and the draw: test_generate_sampling.py."""

import itertools

import pytest
import torch

from data.tokenizer import SPECIAL_TOKENS
from model import MLPS, NORMS
from model.generate import TextStream, check_sampling_args, encode_prompt, generate, generate_ids
from tests.tiny_checkpoint import random_model, single_thread, tiny_config, tiny_tokenizer  # noqa: F401 (autouse)

TOKENIZER = tiny_tokenizer()
VOCAB = TOKENIZER.get_vocab_size()  # 300: not a multiple of 64, so every model here has 20 padding rows


def model_for(seed: int = 0, **overrides):
    # init_std 0.3: at the usual 0.02 a random model's greedy output is one token repeated, which
    # would make "same tokens" comparisons nearly vacuous.
    return random_model(tiny_config(VOCAB, init_std=0.3, **overrides), seed)


def naive_greedy(model, prompt, n, window=None):
    """The reference: recompute the whole (window of the) sequence each step, argmax, no cache."""
    ids, max_len = list(prompt), model.cfg.max_seq_len
    start = 0
    with torch.no_grad():
        for _ in range(n):
            if len(ids) - start >= max_len:  # the documented slide: keep the last max_seq_len // 2
                start = len(ids) - max_len // 2
            ids.append(int(model(torch.tensor([ids[start:]]))[0, -1, :VOCAB].argmax()))  # real tokens only
    return ids[len(prompt) :]


@pytest.mark.parametrize("norm,mlp,qk_norm", [*itertools.product(NORMS, MLPS, [False]), ("rmsnorm", "swiglu", True)])
def test_cached_greedy_equals_full_recompute_on_every_variant(norm, mlp, qk_norm):
    model = model_for(norm=norm, mlp=mlp, qk_norm=qk_norm)
    prompt = TOKENIZER.encode("ROMEO: But, soft!").ids
    expected = naive_greedy(model, prompt, 24)
    assert len(set(expected)) > 3, "degenerate random model: the comparison would prove little"
    assert generate_ids(model, [prompt], 24, temperature=0) == [expected]
    assert generate_ids(model, [prompt], 24, temperature=0, use_cache=False) == [expected]


@pytest.mark.parametrize("max_seq_len", [16, 3])
def test_generation_past_the_context_slides_the_same_way_with_and_without_cache(max_seq_len):
    model = model_for(max_seq_len=max_seq_len)  # 3: the slide keeps a single token
    prompt = TOKENIZER.encode("JULIET: O Romeo").ids[-(max_seq_len - 1) :]
    n = 40  # crosses the window several times
    expected = naive_greedy(model, prompt, n)
    cached = generate_ids(model, [prompt], n, temperature=0)
    assert cached == [expected] == generate_ids(model, [prompt], n, temperature=0, use_cache=False)
    # Before the first slide, nothing differs from plain generation in a long enough context.
    fits = max_seq_len - len(prompt)
    assert cached[0][:fits] == naive_greedy(model, prompt, fits)


def fed_lengths(model) -> list:
    """How many tokens each forward pass of `model` is given, recorded as generation runs."""
    fed = []
    model.register_forward_pre_hook(lambda module, args: fed.append(args[0].shape[1]))
    return fed


@pytest.mark.parametrize("use_cache", [True, False, None])
def test_the_cache_feeds_one_token_per_step_and_recompute_feeds_the_window(use_cache):
    """What the cache is for: after the prompt, one token per forward pass (the default), instead of
    the whole sequence again; and it is sized to this call, not to the model's context."""
    model = model_for()
    fed = fed_lengths(model)
    kwargs = {} if use_cache is None else {"use_cache": use_cache}
    generate(model, TOKENIZER, ["ROMEO:"], max_new_tokens=6, temperature=0, **kwargs)
    prompt = len(TOKENIZER.encode("ROMEO:").ids)
    assert fed == ([prompt] + [1] * 5 if use_cache is not False else list(range(prompt, prompt + 6)))
    sizes = []
    model.new_kv_cache = lambda *a, new=model.new_kv_cache, **kw: sizes.append(kw) or new(*a, **kw)
    generate_ids(model, [[5, 6, 7]], 4, temperature=0)
    assert sizes == [{"max_seq_len": 7}]  # 3 prompt tokens + 4 new, not max_seq_len=64


def test_defaults_are_128_new_tokens_at_temperature_1():
    model = model_for()
    seen = []
    first = generate(model, TOKENIZER, ["O"], seed=5, on_token=lambda row, i: seen.append(i))
    assert len(seen) == 128
    assert first == generate(model, TOKENIZER, ["O"], max_new_tokens=128, temperature=1.0, seed=5)


def test_prompt_that_fills_the_context_is_a_clear_error():
    model = model_for(max_seq_len=16)
    with pytest.raises(ValueError, match="max_seq_len=16"):
        generate_ids(model, [list(range(3, 19))], 4)
    assert len(generate_ids(model, [list(range(3, 18))], 4, temperature=0)[0]) == 4  # 15 tokens still fit


def test_batched_prompts_of_different_lengths_equal_one_at_a_time():
    model = model_for()
    prompts = [TOKENIZER.encode(t).ids for t in ("ROMEO:", "JULIET: O Romeo, Romeo!", "O", "But, soft! what")]
    assert len({len(p) for p in prompts}) == len(prompts)
    alone = [generate_ids(model, [p], 12, temperature=0)[0] for p in prompts]
    assert generate_ids(model, prompts, 12, temperature=0) == alone
    assert generate_ids(model, prompts, 12, temperature=0, use_cache=False) == alone


def test_sampling_is_reproducible_with_a_seed_and_varies_without_it():
    model = model_for()
    prompt = [TOKENIZER.encode("ROMEO:").ids]
    kwargs = dict(max_new_tokens=20, temperature=1.5, top_k=50, top_p=0.95)
    assert generate_ids(model, prompt, seed=3, **kwargs) == generate_ids(model, prompt, seed=3, **kwargs)
    assert generate_ids(model, prompt, seed=3, **kwargs) != generate_ids(model, prompt, seed=4, **kwargs)


def test_top_k_1_and_temperature_0_are_greedy():
    model = model_for()
    prompt = [TOKENIZER.encode("JULIET:").ids]
    greedy = generate_ids(model, prompt, 16, temperature=0)
    assert generate_ids(model, prompt, 16, temperature=1.0, top_k=1, seed=0) == greedy
    assert greedy == [naive_greedy(model, prompt[0], 16)]


def test_generation_stops_after_eos():
    model = model_for()
    prompt = TOKENIZER.encode("ROMEO:").ids
    free = generate_ids(model, [prompt], 20, temperature=0)[0]
    eos = free[5]
    stopped = generate_ids(model, [prompt], 20, temperature=0, eos_id=eos)[0]
    assert stopped == free[: free.index(eos) + 1]
    # Text API: the stop token is not part of the text; without stop_at_eos generation runs on.
    eos_token = TOKENIZER.id_to_token(eos)
    text = generate(model, TOKENIZER, ["ROMEO:"], 20, temperature=0, eos_token=eos_token)[0]
    assert text == TOKENIZER.decode(free[: free.index(eos)], skip_special_tokens=False)
    full = generate(model, TOKENIZER, ["ROMEO:"], 20, temperature=0, eos_token=eos_token, stop_at_eos=False)[0]
    assert full == TOKENIZER.decode(free, skip_special_tokens=False)


def test_streamed_pieces_concatenate_to_the_returned_text():
    model = model_for()
    pieces = {}
    texts = generate(
        model,
        TOKENIZER,
        ["ROMEO:", "日本"],
        30,
        temperature=1.0,
        seed=0,
        num_samples=2,
        on_text=lambda row, piece: pieces.setdefault(row, []).append(piece),
    )
    assert len(texts) == 4 and texts[0] != texts[1]  # prompt-major: two different samples of "ROMEO:"
    assert ["".join(pieces.get(row, [])) for row in range(4)] == texts


def test_text_stream_holds_back_split_characters():
    text = "日本語 😀 café"
    ids = TOKENIZER.encode(text).ids
    assert len(ids) > len(text.split()), "the test needs characters split across tokens"
    stream = TextStream(TOKENIZER)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_text_stream_flush_keeps_special_tokens_before_a_cut_character():
    """A special token already streamed, then half a character when generation ends: flush gives the
    replacement character, not a text that lost the special token and moved the cut."""
    partial = TOKENIZER.encode("日本語").ids[0]
    assert TOKENIZER.decode([partial]).endswith("\ufffd"), "the test needs a token that splits a character"
    stream = TextStream(TOKENIZER)
    assert stream.push(TOKENIZER.token_to_id(SPECIAL_TOKENS["bos"])) == SPECIAL_TOKENS["bos"]
    assert stream.push(partial) == ""  # held back
    assert stream.flush() == TOKENIZER.decode([partial])


def test_empty_prompt_starts_a_new_document_after_eos():
    """Training puts EOS between documents and no BOS anywhere, so '' continues from EOS."""
    model = model_for()
    eos, bos = (TOKENIZER.token_to_id(SPECIAL_TOKENS[role]) for role in ("eos", "bos"))
    from_eos = generate_ids(model, [[eos]], 12, temperature=0)[0]
    assert from_eos != generate_ids(model, [[bos]], 12, temperature=0)[0]  # the start token shows
    out = generate(model, TOKENIZER, [""], 12, temperature=0, stop_at_eos=False, eos_token=SPECIAL_TOKENS["eos"])
    assert out == [TOKENIZER.decode(from_eos, skip_special_tokens=False)]
    assert encode_prompt(TOKENIZER, "", eos) == [eos] and encode_prompt(TOKENIZER, "ROMEO:", eos)[0] != eos
    with pytest.raises(ValueError) as raised:
        generate(model, TOKENIZER, [""], 4, eos_token=None)
    assert str(raised.value) == "the prompt is empty and the tokenizer has no end-of-document token to start from"
    with pytest.raises(ValueError, match="top_k=0"):  # options are checked first, before any prompt
        generate(model, TOKENIZER, [""], 4, top_k=0, eos_token=None)
    with pytest.raises(ValueError, match="top_p=2"):
        generate(model, TOKENIZER, [""], 4, top_p=2, eos_token=None)


def test_bf16_model_generates_with_a_bf16_cache():
    model = model_for().to(torch.bfloat16)
    assert model.new_kv_cache(1).keys[0].dtype == torch.bfloat16
    ids = generate_ids(model, [TOKENIZER.encode("ROMEO:").ids], 8, temperature=0)[0]
    assert len(ids) == 8 and all(0 <= i < VOCAB for i in ids)


def padding_loving(model):
    """+100 on every logit from vocab_size up: without the mask every generated id would be one of them."""
    bias = torch.zeros(model.cfg.padded_vocab_size)
    bias[VOCAB:] = 100.0
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias.to(out.dtype))
    return model


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(temperature=0),
        dict(temperature=0, use_cache=False),
        dict(temperature=1.5, seed=0),
        dict(temperature=1.0, top_k=5, top_p=0.9, seed=1),
    ],
)
def test_padding_ids_are_never_generated(kwargs):
    model = padding_loving(model_for())
    assert model.cfg.padded_vocab_size == 320 and model.cfg.vocab_size == VOCAB == 300
    prompt = TOKENIZER.encode("ROMEO:").ids
    with torch.no_grad():
        assert (model(torch.tensor([prompt])).argmax(-1) >= VOCAB).all()  # the trap is set
    new = generate_ids(model, [prompt, prompt[:2]], 30, **kwargs)
    assert all(0 <= i < VOCAB for ids in new for i in ids) and all(len(ids) == 30 for ids in new)


def test_text_generation_stays_within_the_tokenizer():
    """A model with more ids than its tokenizer (vocab_size 310, 300 tokens): the extra ids are padding too."""
    model = random_model(tiny_config(VOCAB + 10, init_std=0.3))
    bias = torch.zeros(model.cfg.padded_vocab_size)
    bias[VOCAB:] = 100.0
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias)
    seen = []
    generate(model, TOKENIZER, ["ROMEO:"], 25, temperature=1.0, seed=0, on_token=lambda row, i: seen.append(i))
    assert len(seen) == 25 and max(seen) < VOCAB


def test_prompt_with_a_padding_id_is_a_clear_error():
    with pytest.raises(ValueError, match=r"outside the vocabulary \[0, 300\)"):
        generate_ids(model_for(), [[5, VOCAB + 3]], 4)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(max_new_tokens=-1), "max_new_tokens"),
        (dict(temperature=-0.5), "temperature"),
        (dict(top_k=0), "top_k"),
        (dict(top_p=1.5), "top_p"),
        (dict(num_samples=0), "num_samples"),
    ],
)
def test_bad_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        generate(model_for(), TOKENIZER, ["x"], **kwargs)


def test_generate_passes_every_sampling_option_through():
    """generate() (the text API) hands top_k, top_p, seed and the callbacks on to the sampler: top_k=1 or a
    tiny top_p at temperature 1 is greedy, the seed decides a sampled text, and bad values are refused."""
    model = model_for()
    prompts = ["ROMEO:", "JULIET: O"]
    greedy = generate(model, TOKENIZER, prompts, max_new_tokens=8, temperature=0.0)
    assert generate(model, TOKENIZER, prompts, max_new_tokens=8, top_k=1, seed=3) == greedy
    assert generate(model, TOKENIZER, prompts, max_new_tokens=8, top_p=1e-6, seed=3) == greedy
    sampled = [generate(model, TOKENIZER, prompts, max_new_tokens=8, seed=s) for s in (0, 0, 1)]
    assert sampled[0] == sampled[1] != sampled[2]
    seen = []
    generate(model, TOKENIZER, prompts, max_new_tokens=3, temperature=0.0, on_token=lambda row, i: seen.append(row))
    assert sorted(seen) == [0, 0, 0, 1, 1, 1]
    for bad, message in (({"top_k": 0}, "top_k=0 must be >= 1"), ({"top_p": 1.5}, r"top_p=1.5 must be in \(0, 1\]")):
        with pytest.raises(ValueError, match=message):
            generate(model, TOKENIZER, prompts, max_new_tokens=2, **bad)


def test_edges_of_the_arguments():
    model = model_for()
    assert generate_ids(model, [[5, 6]], 0) == [[]]  # nothing to generate is not an error
    assert generate(model, TOKENIZER, ["ROMEO:"], 0) == [""]
    assert len(generate_ids(model, [[5, 6]], 3, top_p=1.0, seed=0)[0]) == 3  # the whole distribution
    with pytest.raises(ValueError, match=r"top_p=0 must be in \(0, 1\]"):
        generate_ids(model, [[5, 6]], 3, top_p=0)
    with pytest.raises(ValueError, match="num_samples=0 must be >= 1"):
        check_sampling_args(4, 1.0, num_samples=0)
    check_sampling_args(4, 1.0)  # one sample by default


def test_prompts_are_checked_with_messages_that_say_the_limits():
    model = model_for(max_seq_len=16)
    with pytest.raises(ValueError) as raised:
        generate_ids(model, [], 4)
    assert str(raised.value) == "no prompts given; pass at least one"
    for bad in ([], list(range(3, 19))):
        with pytest.raises(ValueError) as raised:
            generate_ids(model, [[5], bad], 4)
        assert str(raised.value) == (
            f"prompt 1 has {len(bad)} tokens; it must have 1 to 15 "
            "(the model's max_seq_len=16 minus room for one new token)"
        )
    with pytest.raises(ValueError, match=r"prompt 0 has token ids outside the vocabulary \[0, 300\)"):
        generate_ids(model, [[VOCAB]], 4)  # the first id past the tokenizer's
    assert len(generate_ids(model, [[VOCAB - 1]], 2)[0]) == 2


def special_loving(model, token_id: int):
    """+100 on one special token's logit: the model says it at every step."""
    bias = torch.zeros(model.cfg.padded_vocab_size)
    bias[token_id] = 100.0
    model.lm_head.register_forward_hook(lambda module, args, out: out + bias.to(out.dtype))
    return model


def test_special_tokens_other_than_the_stopping_eos_are_part_of_the_text():
    bos = SPECIAL_TOKENS["bos"]
    model = special_loving(model_for(), TOKENIZER.token_to_id(bos))
    pieces = []
    text = generate(
        model,
        TOKENIZER,
        ["O"],
        3,
        temperature=0,
        eos_token=SPECIAL_TOKENS["eos"],
        on_text=lambda row, piece: pieces.append(piece),
    )
    assert text == [bos * 3] and pieces == [bos] * 3  # streamed as they come, not all at the end


def test_an_eos_that_never_comes_trims_nothing():
    model = model_for()
    free = generate_ids(model, [TOKENIZER.encode("ROMEO:").ids], 12, temperature=0)[0]
    never = next(i for i in range(VOCAB) if i not in free)
    text = generate(model, TOKENIZER, ["ROMEO:"], 12, temperature=0, eos_token=TOKENIZER.id_to_token(never))
    assert text == [TOKENIZER.decode(free, skip_special_tokens=False)]
    assert generate_ids(model, [TOKENIZER.encode("ROMEO:").ids], 12, temperature=0, eos_id=never) == [free]
