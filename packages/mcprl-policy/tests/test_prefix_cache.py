"""The prefix store: longest proper prefix, reuse, LRU byte budget, invalidation on weight changes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mcprl_policy.cache_rows import AttentionRow, RecurrentRow
from mcprl_policy.fingerprint import weights_fingerprint
from mcprl_policy.prefix_blocks import common_length
from mcprl_policy.prefix_cache import CachedPrefix, PrefixCache


def _kv(n: int, layers: int = 2) -> CachedPrefix:
    """Attention layers (keys/values of ``n`` positions) and, as in a hybrid model, one recurrent layer."""
    t = torch.arange(n, dtype=torch.float32).reshape(1, n, 1).expand(2, n, 4).clone()
    recurrent = RecurrentRow(conv=torch.ones(6, 4), recurrent=torch.ones(2, 3, 3))
    return CachedPrefix(
        layers=(recurrent, *(AttentionRow(keys=t, values=t + 0.5) for _ in range(layers))), length=n
    )


def test_lookup_returns_the_longest_proper_prefix_and_keeps_it() -> None:
    cache = PrefixCache(max_bytes=10**6)
    cache.put([1, 2], _kv(2))
    cache.put([1, 2, 3, 4], _kv(4))
    cache.put([1, 2, 3, 4, 5, 6], _kv(6))  # as long as the prompt below: not a proper prefix
    for _ in range(2):  # the G episodes of a group often continue the same first turn
        hit = cache.lookup([1, 2, 3, 4, 5, 6])
        assert hit is not None
        assert hit.length == 4
    assert cache.lookup([1, 2, 3, 9]).length == 2  # type: ignore[union-attr]
    assert cache.lookup([7, 8, 9]) is None
    assert cache.lookup([1, 2]) is None
    assert len(cache) == 3


def test_the_byte_budget_evicts_the_least_recently_used_entries() -> None:
    size = _kv(3).nbytes
    cache = PrefixCache(max_bytes=2 * size)
    cache.put([0, 0, 0], _kv(3))
    cache.put([1, 1, 1], _kv(3))
    assert cache.lookup([0, 0, 0, 9]) is not None  # now [1, 1, 1] is the least recently used
    cache.put([2, 2, 2], _kv(3))
    assert len(cache) == 2
    assert cache.nbytes == 2 * size
    assert cache.lookup([1, 1, 1, 9]) is None
    assert cache.lookup([0, 0, 0, 9]) is not None
    assert cache.lookup([2, 2, 2, 9]) is not None


def test_a_zero_budget_stores_nothing_and_a_length_mismatch_is_refused() -> None:
    cache = PrefixCache(max_bytes=0)
    cache.put([1, 2], _kv(2))
    assert len(cache) == 0
    with pytest.raises(ValueError, match="state of 3 tokens stored under 2"):
        PrefixCache(max_bytes=10**6).put([1, 2], _kv(3))
    keys = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="keys of 3 positions in a prefix of 2 tokens"):
        CachedPrefix(layers=(AttentionRow(keys=keys, values=keys),), length=2)
    with pytest.raises(ValueError, match="max_bytes"):
        PrefixCache(max_bytes=-1)


def test_an_in_place_update_of_any_weight_changes_the_version() -> None:
    layer = torch.nn.Linear(3, 3)
    before = weights_fingerprint(layer)
    assert weights_fingerprint(layer) == before
    with torch.no_grad():
        layer.bias.add_(1.0)
    after = weights_fingerprint(layer)
    assert after != before
    cache = PrefixCache(max_bytes=10**6)
    cache.validate(before)
    cache.put([1, 2], _kv(2))
    assert cache.validate(before)
    assert len(cache) == 1
    assert not cache.validate(after)
    assert len(cache) == 0


@given(
    st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=6), max_size=12),
    st.lists(st.integers(0, 3), max_size=8),
)
def test_lookup_agrees_with_a_linear_scan(stored: list[list[int]], prompt: list[int]) -> None:
    cache = PrefixCache(max_bytes=10**9)
    for ids in stored:
        cache.put(ids, _kv(len(ids)))
    keys = {tuple(ids) for ids in stored}
    proper = [k for k in keys if len(k) < len(prompt) and tuple(prompt[: len(k)]) == k]
    hit = cache.lookup(prompt)
    if not proper:
        assert hit is None
    else:
        assert hit is not None
        assert hit.length == max(len(k) for k in proper)
    assert len(cache) == len(keys)
    assert cache.nbytes == sum(_kv(len(k)).nbytes for k in keys)


def test_an_entrys_size_counts_attention_and_recurrent_layers() -> None:
    entry = _kv(5, layers=2)
    assert entry.nbytes == 4 * (2 * 2 * (2 * 5 * 4) + 6 * 4 + 2 * 3 * 3)  # float32: 2 layers x (keys, values)


def _attention(n: int, layers: int = 2) -> CachedPrefix:
    """Attention layers only (a full-attention model), position ``j``'s keys all ``j``."""
    t = torch.arange(n, dtype=torch.float32).reshape(1, n, 1).expand(2, n, 4).clone()
    return CachedPrefix(layers=tuple(AttentionRow(keys=t, values=t + 0.5) for _ in range(layers)), length=n)


def test_a_partial_lookup_cuts_the_entry_to_the_shared_prefix() -> None:
    cache = PrefixCache(max_bytes=10**6, partial=True, block_tokens=4)
    system = list(range(10))
    cache.put([*system, 50, 51, 52], _attention(13))
    hit = cache.lookup([*system, 60, 61])
    assert hit is not None
    assert hit.length == 10  # past the 2 whole blocks, up to where the ids differ
    for layer in hit.layers:
        assert isinstance(layer, AttentionRow)
        torch.testing.assert_close(layer.keys, _attention(13).layers[0].keys[:, :10])  # type: ignore[union-attr]
    assert cache.lookup([*system[:3], 60, 61]) is None  # less than a block shared
    assert cache.lookup([*system, 50, 51, 52, 53]).length == 13  # type: ignore[union-attr]
    assert cache.lookup(system).length == 9  # type: ignore[union-attr]  # a token is left to feed
    assert PrefixCache(max_bytes=10**6, block_tokens=4).lookup([*system, 60]) is None  # not partial


def test_a_recurrent_state_is_never_cut_back() -> None:
    with pytest.raises(ValueError, match="recurrent"):
        _kv(6).truncated(4)
    with pytest.raises(ValueError, match="cannot cut"):
        _attention(6).truncated(7)
    entry = _attention(6)
    assert entry.truncated(6) is entry


def test_evicted_and_invalidated_entries_leave_the_block_index() -> None:
    size = _attention(8).nbytes
    cache = PrefixCache(max_bytes=2 * size, partial=True, block_tokens=4)
    cache.put([0] * 8, _attention(8))
    cache.put([1] * 8, _attention(8))
    cache.put([2] * 8, _attention(8))  # evicts [0] * 8
    assert cache.lookup([0] * 6) is None
    assert cache.lookup([1] * 6).length == 5  # type: ignore[union-attr]
    cache.put([3] * 8, _attention(8))  # evicts [2] * 8: [1] * 8 was used last
    assert cache.lookup([2] * 6) is None
    assert cache.lookup([1] * 6) is not None
    cache.validate(weights_fingerprint(torch.nn.Linear(2, 2)))
    assert cache.lookup([1] * 6) is None
    assert cache.lookup([3] * 6) is None


@given(
    st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=9), max_size=10),
    st.lists(st.integers(0, 2), max_size=10),
)
def test_a_partial_lookup_agrees_with_a_linear_scan(stored: list[list[int]], prompt: list[int]) -> None:
    cache = PrefixCache(max_bytes=10**9, partial=True, block_tokens=2)
    for ids in stored:
        cache.put(ids, _attention(len(ids)))
    best = 0
    for key in {tuple(ids) for ids in stored}:
        shared = min(common_length(key, prompt), len(prompt) - 1)
        whole = shared == len(key)
        if shared >= 2 or (whole and shared > 0):
            best = max(best, shared)
    hit = cache.lookup(prompt)
    assert (hit.length if hit is not None else 0) == best
