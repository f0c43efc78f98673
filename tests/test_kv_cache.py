"""KV-cache decoding equals full recompute (token by token and in chunks); sizes, reset and overflow."""
import pytest
import torch

from model import KVCache, Transformer
from model_helpers import one_thread, random_transformer, tiny_model_config

CFG = tiny_model_config()  # n_heads 4, n_kv_heads 2: the cache path must handle GQA


def full_and_incremental(chunks: list) -> tuple:
    """Logits for the whole sequence in one pass, and fed through a cache in `chunks` pieces."""
    model = random_transformer(CFG)
    torch.manual_seed(2)
    ids = torch.randint(0, CFG.vocab_size, (2, sum(chunks)))
    with one_thread(), torch.no_grad():
        full = model(ids)
        cache = model.new_kv_cache(batch_size=2)
        pieces, start = [], 0
        for n in chunks:
            pieces.append(model(ids[:, start:start + n], cache=cache))
            start += n
            assert cache.length == start
    return full, torch.cat(pieces, dim=1)


def test_prefill_then_one_token_at_a_time_equals_full_forward():
    full, incremental = full_and_incremental([6] + [1] * 10)
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-5)


def test_chunked_prefill_after_a_cache_equals_full_forward():
    # T > 1 new tokens after cached ones is where a top-left causal mask would hide the cache.
    full, incremental = full_and_incremental([5, 4, 1, 2, 7, 1, 3])
    torch.testing.assert_close(incremental, full, rtol=0, atol=1e-5)


def test_cache_is_sized_for_kv_heads_and_model_dtype():
    model = random_transformer(CFG)
    cache = model.new_kv_cache(batch_size=3, max_seq_len=10)
    assert isinstance(cache, KVCache) and len(cache.keys) == len(cache.values) == CFG.n_layers
    assert cache.keys[0].shape == (3, CFG.resolved_n_kv_heads, 10, CFG.head_dim)
    assert cache.keys[0].dtype == torch.float32
    assert model.new_kv_cache(1).keys[0].shape[2] == CFG.max_seq_len
    assert model.new_kv_cache(1, dtype=torch.bfloat16).values[1].dtype == torch.bfloat16


def test_reset_reuses_the_cache():
    model = random_transformer(CFG)
    ids = torch.randint(0, CFG.vocab_size, (1, 8))
    with torch.no_grad():
        cache = model.new_kv_cache(1)
        first = model(ids, cache=cache)
        cache.reset()
        assert cache.length == 0
        torch.testing.assert_close(model(ids, cache=cache), first, rtol=0, atol=0)


def test_overflow_raises():
    model = random_transformer(CFG)
    ids = torch.randint(0, CFG.vocab_size, (1, 6))
    with torch.no_grad():
        cache = model.new_kv_cache(1, max_seq_len=8)
        model(ids, cache=cache)
        with pytest.raises(ValueError, match="KV cache overflow: 9 positions > max_seq_len=8"):
            model(ids[:, :3], cache=cache)
        model(ids[:, :2], cache=cache)  # exactly full is fine
        assert cache.length == 8
        # The model's own limit is checked before any layer writes.
        long_cache = model.new_kv_cache(1)
        model(torch.zeros(1, CFG.max_seq_len - 2, dtype=torch.long), cache=long_cache)
        with pytest.raises(ValueError, match="max_seq_len"):
            model(ids[:, :3], cache=long_cache)
        assert long_cache.length == CFG.max_seq_len - 2


def test_cache_and_masks_live_on_the_models_device():
    """Built on `meta` (any non-CPU device behaves alike): the cache, the chunked-decode mask and
    the forward pass stay there; a buffer made on the CPU would fail to meet a meta tensor."""
    with torch.device("meta"):
        model = Transformer(CFG)
    cache = model.new_kv_cache(2)
    assert {t.device.type for t in cache.keys + cache.values} == {"meta"}
    ids = torch.zeros(2, 4, dtype=torch.long, device="meta")
    model(ids, cache)
    assert model(ids[:, :3], cache).device.type == "meta"  # 3 new tokens after 4 cached: an explicit mask
    assert KVCache(1, 1, 4, 1, 2, device="meta").values[0].device.type == "meta"
    default = KVCache(1, 1, 4, 1, 2)
    assert default.keys[0].device.type == "cpu" and default.keys[0].dtype == torch.float32
