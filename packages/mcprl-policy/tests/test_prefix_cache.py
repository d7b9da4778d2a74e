"""The prefix store: longest proper prefix, reuse, LRU byte budget, invalidation on weight changes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mcprl_policy.cache_rows import AttentionRow, RecurrentRow
from mcprl_policy.fingerprint import weights_fingerprint
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
