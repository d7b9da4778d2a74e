"""Reuse of the KV cache across the turns of a multi-turn episode.

An episode's next prompt is its previous prompt, the tokens the sampler generated and the tokens the
environment appended (token-in/token-out: never re-tokenised). Without reuse every turn prefills the whole
conversation again. `PrefixCache` keeps, for each finished request, the cache state of the tokens the model
consumed (the prompt and every generated token but the last) under those token ids; a later request whose
prompt starts with such a sequence reuses that entry and prefills only the rest. Entries are keyed by the
whole consumed sequence and only ever resumed at its end, which is what a linear-attention layer's recurrent
state allows (`mcprl_policy.cache_rows.RecurrentRow`: valid after exactly those tokens, never a shorter prefix). Entries stay after use (the G
episodes of a group often sample the same first turns, so several continuations share one entry), are evicted
least-recently-used past a byte budget, and are all dropped when the model's weights change (the tensors'
version counters, `mcprl_policy.fingerprint`, move on any in-place update: an optimizer step,
``load_state_dict``, a weight sync).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import attrs

from mcprl_policy.cache_rows import AttentionRow, RowState
from mcprl_policy.fingerprint import Fingerprint

__all__ = ["CachedPrefix", "PrefixCache"]


@attrs.frozen(kw_only=True, eq=False)
class CachedPrefix:
    """The cache state of one token sequence, per layer (`RowState`: attention keys/values of its ``length``
    positions, or a recurrent state after its last token)."""

    layers: tuple[RowState, ...]
    length: int = attrs.field(validator=attrs.validators.ge(0))

    def __attrs_post_init__(self) -> None:
        for layer in self.layers:
            if isinstance(layer, AttentionRow) and layer.length != self.length:
                raise ValueError(f"keys of {layer.length} positions in a prefix of {self.length} tokens")

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)


class PrefixCache:
    """Token-id-keyed cache entries with a byte budget (0 disables the cache).

    Args:
        max_bytes: Most bytes of cached states held; the least recently used entries go first.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], CachedPrefix] = OrderedDict()
        self._lengths: Counter[int] = Counter()
        self._bytes = 0
        self._version: Fingerprint | None = None

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def validate(self, version: Fingerprint) -> bool:
        """Drop every entry if the weights changed since the entries were stored; True when they were kept."""
        if version == self._version:
            return True
        self.clear()
        self._version = version
        return False

    def clear(self) -> None:
        self._entries.clear()
        self._lengths.clear()
        self._bytes = 0

    def put(self, token_ids: Sequence[int], prefix: CachedPrefix) -> None:
        """Store the state of ``token_ids`` (``prefix.length`` must equal ``len(token_ids)``)."""
        if prefix.length != len(token_ids):
            raise ValueError(f"state of {prefix.length} tokens stored under {len(token_ids)} token ids")
        size = prefix.nbytes
        if self.max_bytes == 0 or size > self.max_bytes or not token_ids:
            return
        key = tuple(token_ids)
        if key in self._entries:
            self._remove(key)
        self._entries[key] = prefix
        self._lengths[len(key)] += 1
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def lookup(self, prompt_ids: Sequence[int]) -> CachedPrefix | None:
        """The longest stored entry that is a proper prefix of ``prompt_ids`` (marked most recently used)."""
        if not self._entries:
            return None
        n = len(prompt_ids)
        for length in sorted((k for k in self._lengths if k < n), reverse=True):
            key = tuple(prompt_ids[:length])
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry
        return None

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]
