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

When every layer is full attention (``partial=True``), an entry also serves a prompt that shares only a prefix
with it: the keys and values of a causal model's first ``n`` positions are the cache of those ``n`` tokens, so
the entry's attention rows cut to the common prefix resume it. Entries are indexed by the chain hashes of their
token blocks (`mcprl_policy.prefix_blocks`), so the prompts of different tasks that share a system prompt and
tool schemas find a cached one with one dictionary look-up per block, whatever the number of entries.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import attrs

from mcprl_policy.cache_rows import AttentionRow, RowState
from mcprl_policy.fingerprint import Fingerprint
from mcprl_policy.prefix_blocks import BLOCK_TOKENS, block_hashes, common_length

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

    def truncated(self, length: int) -> CachedPrefix:
        """The state of this sequence's first ``length`` tokens (views of its attention rows).

        Raises:
            ValueError: a recurrent layer (its state holds only after the last token) or ``length`` out of range.
        """
        if not 0 < length <= self.length:
            raise ValueError(f"cannot cut a prefix of {self.length} tokens to {length}")
        if length == self.length:
            return self
        rows: list[RowState] = []
        for layer in self.layers:
            if not isinstance(layer, AttentionRow):
                raise ValueError("a recurrent layer's state cannot be cut back to a shorter prefix")
            rows.append(AttentionRow(keys=layer.keys[:, :length], values=layer.values[:, :length]))
        return CachedPrefix(layers=tuple(rows), length=length)


class PrefixCache:
    """Token-id-keyed cache entries with a byte budget (0 disables the cache).

    Args:
        max_bytes: Most bytes of cached states held; the least recently used entries go first.
        partial: Whether an entry also serves prompts sharing only a prefix of it (every layer full attention).
        block_tokens: Block size of the partial look-up: a partial hit shares at least one whole block.
    """

    def __init__(self, max_bytes: int, *, partial: bool = False, block_tokens: int = BLOCK_TOKENS) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        self.max_bytes = max_bytes
        self.partial = partial
        self.block_tokens = block_tokens
        # chain hash of a block -> the keys of the entries holding it (insertion-ordered set)
        self._blocks: dict[int, dict[tuple[int, ...], None]] = {}
        self._hashes: dict[tuple[int, ...], list[int]] = {}
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
        self._blocks.clear()
        self._hashes.clear()
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
        if self.partial:
            hashes = block_hashes(key, limit=len(key), block=self.block_tokens)
            self._hashes[key] = hashes
            for h in hashes:
                self._blocks.setdefault(h, {})[key] = None
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._remove(next(iter(self._entries)))

    def lookup(self, prompt_ids: Sequence[int]) -> CachedPrefix | None:
        """The longest stored entry that is a proper prefix of ``prompt_ids``; with ``partial``, or the longest
        proper prefix of ``prompt_ids`` that an entry starts with, if longer and at least a block long (the
        entry cut to it). The entry used is marked most recently used."""
        if not self._entries:
            return None
        whole = self._whole(prompt_ids)
        part = self._longest_shared(prompt_ids) if self.partial else None
        if part is not None and (whole is None or part[1] > len(whole)):
            key, length = part
            self._entries.move_to_end(key)
            return self._entries[key].truncated(length)
        if whole is None:
            return None
        self._entries.move_to_end(whole)
        return self._entries[whole]

    def _whole(self, prompt_ids: Sequence[int]) -> tuple[int, ...] | None:
        n = len(prompt_ids)
        for length in sorted((k for k in self._lengths if k < n), reverse=True):
            key = tuple(prompt_ids[:length])
            if key in self._entries:
                return key
        return None

    def _longest_shared(self, prompt_ids: Sequence[int]) -> tuple[tuple[int, ...], int] | None:
        """The entry sharing the longest prefix (of at least one block, leaving a token) with ``prompt_ids``."""
        limit = len(prompt_ids) - 1
        hashes = block_hashes(prompt_ids, limit=limit, block=self.block_tokens)
        blocks = 0
        for h in hashes:
            if h not in self._blocks:
                break  # chained: no entry holds a later block without this one
            blocks += 1
        if not blocks:
            return None
        aligned = blocks * self.block_tokens
        candidates = self._blocks[hashes[blocks - 1]]
        prompt = list(prompt_ids[:limit])
        best = max(candidates, key=lambda k: common_length(k, prompt, start=aligned))
        if list(best[:aligned]) != prompt[:aligned]:  # a hash collision, not a shared prefix
            return None
        return best, common_length(best, prompt, start=aligned)

    def _remove(self, key: tuple[int, ...]) -> None:
        entry = self._entries.pop(key)
        self._bytes -= entry.nbytes
        self._lengths[len(key)] -= 1
        if not self._lengths[len(key)]:
            del self._lengths[len(key)]
        for h in self._hashes.pop(key, ()):
            holders = self._blocks[h]
            del holders[key]
            if not holders:
                del self._blocks[h]
