"""A preallocated KV cache for the decode engine's running rows (full-attention models).

Every full-attention layer gets one key and one value buffer ``(slots, kv_heads, columns, head_dim)``; a
decode step writes each row's new key and value into the next column in place (`PoolLayer.update`, plugged
into the model's forward as a transformers ``Cache``), so nothing is concatenated per step. Rows live in
consecutive slots ``[lo, lo + rows)`` in the engine's row order: an admitted row is written into the next free
slot (the running rows are not touched; they are moved down to slot 0 first when the slots after them run out),
a finished row's slot is closed up by moving the rows on the side of it with fewer rows toward it (the rows
after it down, or the rows before it up), and buffers are reallocated when rows (doubling) or columns (the
window plus a little headroom) run out.

The columns keep the layout of the concatenating engine (`mcprl_policy.batch_cache.ConcatCache`) exactly:
every row's last token sits in the same column (``end - 1``), shorter rows are masked on the left, the
window handed to attention is ``[start, end]`` with ``start`` the first column any running row uses. A row
thus sees the same keys at the same offsets, masked the same way, as it would in the concatenated cache, and
its logits are the same bits (`tests/test_kv_pool.py`); masked columns hold stale finite values instead of
zeros, which a boolean mask removes before the softmax. Rows keep their order because it matters: with more
than one thread, torch's CPU kernels split a batch between threads by row, and a row's result can move in the
last bit when it changes place.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any, Final

import torch
from transformers import Cache, DynamicCache
from transformers.cache_utils import CacheLayerMixin, DynamicLayer

from mcprl_policy.batch_cache import Forward
from mcprl_policy.cache_rows import AttentionRow, RowState
from mcprl_policy.errors import SamplerError

__all__ = ["KVPool", "PoolLayer"]

_MIN_COLUMNS: Final = 64
_HEADROOM: Final = 32


class PoolLayer(CacheLayerMixin):
    """One layer's view of a `KVPool` for transformers' attention: ``update`` writes in place.

    It holds its pool by a weak reference: the pool holds its layers (through its ``Cache``), and a strong
    reference back would make a cycle that only the cyclic collector frees, so every pool the engine replaced
    kept its buffers (3 GB for 32 rows of SmolLM2-135M at 2,048 columns) until a full collection came.
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, pool: KVPool, index: int) -> None:
        super().__init__()
        self._pool_ref = weakref.ref(pool)
        self._index = index
        self.is_initialized = True

    @property
    def _pool(self) -> KVPool:
        pool = self._pool_ref()
        if pool is None:
            raise SamplerError("a KV pool's layer was used after its pool was released")
        return pool

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        del key_states, value_states

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object, **kwargs: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(rows, kv_heads, 1, head_dim)`` keys/values at the pool's next column; the window to attend."""
        del args, kwargs
        return self._pool.write(self._index, key_states, value_states)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self._pool.width + query_length, 0

    def get_seq_length(self) -> int:
        return self._pool.width

    def get_max_length(self) -> int:
        return -1


class KVPool:
    """Keys and values of the running rows in preallocated, in-place buffers (see the module docstring).

    Args:
        max_rows: most rows at once (the engine's ``max_batch_size``): slots grow by doubling up to it.
        device: the model's device.

    Buffers are sized on the first `merge`, from the layers, heads, dtype and device of the cache merged.
    """

    def __init__(self, *, max_rows: int, device: torch.device) -> None:
        if max_rows < 1:
            raise ValueError(f"a KV pool needs max_rows >= 1, got {max_rows}")
        self.max_rows = max_rows
        self._keys: list[torch.Tensor] = []
        self._values: list[torch.Tensor] = []
        self._mask = torch.zeros(0, 0, dtype=torch.bool, device=device)
        self._cache = Cache(layers=[])
        self._layers = 0
        self.rows = 0
        self.lo = 0  # slot of the first running row
        self.end = 0
        self.start = 0
        self._first: list[int] = []  # per row: first column it uses
        self._gap: list[int] = []  # per row: masked columns between its first and its last
        self._padded = False

    @property
    def width(self) -> int:
        """Columns of the window before this step's token."""
        return self.end - self.start

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self._keys, *self._values))

    def write(
        self, layer: int, keys: torch.Tensor, values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store column ``end`` of every running row for ``layer``; the keys/values of ``[start, end]``."""
        k, v = self._keys[layer], self._values[layer]
        rows = slice(self.lo, self.lo + self.rows)
        k[rows, :, self.end] = keys[:, :, 0]
        v[rows, :, self.end] = values[:, :, 0]
        return k[rows, :, self.start : self.end + 1], v[rows, :, self.start : self.end + 1]

    def step(self, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step of every row: ``tokens``/``positions`` ``(B,)``; the last position's logits ``(B, V)``."""
        if self.end == self._mask.shape[1]:
            self._reallocate(rows=self._keys[0].shape[0], window=self.width)
        rows = slice(self.lo, self.lo + self.rows)
        self._mask[rows, self.end] = True
        mask = self._mask[rows, None, None, self.start : self.end + 1] if self._padded else None
        out = forward(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=positions[:, None],
            past_key_values=self._cache,
        )
        self.end += 1
        return out.logits[:, -1]

    def merge(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append the rows of a prefilled ``cache`` (attention mask ``mask`` ``(n, W)``) after the running ones."""
        n, width = mask.shape
        if self.rows + n > self.max_rows:
            raise SamplerError(f"{self.rows} + {n} rows exceed the pool's {self.max_rows}")
        layers = [_dynamic(layer) for layer in cache.layers]
        if not self._keys:
            self._layers = len(layers)
            self._cache = Cache(layers=[PoolLayer(self, i) for i in range(self._layers)])
            self._allocate(layers[0][0], rows=n, columns=_columns(width + _HEADROOM))
        if len(layers) != self._layers:
            raise SamplerError(f"a cache of {len(layers)} layers merged into a pool of {self._layers}")
        if not self.rows:
            self.lo = 0
            if width + _HEADROOM < self._mask.shape[1]:
                self.end = self.start = width + _HEADROOM
        slots = self._keys[0].shape[0]
        window = max(self.width if self.rows else 0, width)
        if self.rows + n > slots or window > self.end:
            self._reallocate(rows=max(slots, self.rows + n), window=window)
        elif self.lo + self.rows + n > slots:
            self._move(list(range(self.lo, self.lo + self.rows)), 0)
            self.lo = 0
        first = self.end - width
        rows = slice(self.lo + self.rows, self.lo + self.rows + n)
        for (keys, values), k, v in zip(layers, self._keys, self._values, strict=True):
            k[rows, :, first : self.end] = keys
            v[rows, :, first : self.end] = values
        self._mask[rows] = False
        self._mask[rows, first : self.end] = mask.bool()
        counts: list[int] = mask.sum(-1).tolist()
        offsets: list[int] = mask.argmax(-1).tolist()
        for count, offset in zip(counts, offsets, strict=True):
            self._first.append(first + offset)
            self._gap.append(width - offset - count)
        self.rows += n
        self._recompute()

    def drop(self, keep: Sequence[int]) -> None:
        """Keep the rows ``keep`` (ascending), in order, in consecutive slots.

        Kept row ``j`` lands in slot ``lo + a + j``; ``a`` is the shift that leaves the most rows where they
        are (the most frequent ``keep[j] - j``; the smallest on a tie), so one row leaving moves the rows on its
        shorter side: those after it down one, or those before it up one.
        """
        n = len(keep)
        shifts = [row - j for j, row in enumerate(keep)]
        a = max(sorted(set(shifts)), key=shifts.count) if keep else 0
        # Shifts never decrease along the rows: the rows before the staying block move up, those after it down.
        up = [j for j, shift in enumerate(shifts) if shift < a]
        down = [j for j, shift in enumerate(shifts) if shift > a]
        for rows in (up, down):
            if rows:
                self._move([self.lo + keep[j] for j in rows], self.lo + a + rows[0])
        self._first = [self._first[i] for i in keep]
        self._gap = [self._gap[i] for i in keep]
        self.lo += a
        self.rows = n
        self._recompute()

    def _move(self, sources: list[int], to: int) -> None:
        """Copy the slots ``sources`` (ascending) to the consecutive slots from ``to``, window columns only."""
        # A gather into a temporary and a copy into the contiguous destination slice: far cheaper on CPU than
        # an advanced-index assignment (index_put_), and safe when sources and destinations overlap.
        src = torch.tensor(sources, device=self._mask.device)
        dst = slice(to, to + len(sources))
        window = slice(self.start, self.end)
        for buffer in (*self._keys, *self._values):
            buffer[dst, :, window] = buffer[:, :, window].index_select(0, src)
        self._mask[dst] = self._mask.index_select(0, src)

    def row_state(self, row: int) -> tuple[RowState, ...]:
        """Row ``row``'s unmasked keys and values per layer, copied out."""
        slot = self.lo + row
        columns = self._mask[slot, self.start : self.end].nonzero().squeeze(-1) + self.start
        return tuple(
            AttentionRow(keys=k[slot].index_select(1, columns), values=v[slot].index_select(1, columns))
            for k, v in zip(self._keys, self._values, strict=True)
        )

    def _recompute(self) -> None:
        if self.rows:
            self.start = min(self._first)
            self._padded = any(g > 0 for g in self._gap) or any(f > self.start for f in self._first)
        else:
            self.start = self.end
            self._padded = False

    def _allocate(self, like: torch.Tensor, *, rows: int, columns: int) -> None:
        slots = min(self.max_rows, _power_of_two(rows))
        shape = (slots, like.shape[1], columns, like.shape[3])
        # Zeros, not empty: masked columns are multiplied by a zero weight, which a NaN would survive.
        self._keys = [like.new_zeros(shape) for _ in range(self._layers)]
        self._values = [like.new_zeros(shape) for _ in range(self._layers)]
        self._mask = torch.zeros(slots, columns, dtype=torch.bool, device=like.device)

    def _reallocate(self, *, rows: int, window: int) -> None:
        """Move the running rows' window ``[end - window, end)`` to the start of buffers sized for ``rows``
        slots and ``window`` columns plus headroom on both sides."""
        old_keys, old_values, old_mask = self._keys, self._values, self._mask
        old_end = self.end
        # Headroom on the left too: a joining row up to `_HEADROOM` columns longer than the window fits.
        end = window + _HEADROOM
        self._allocate(old_keys[0], rows=rows, columns=_columns(end))
        n, columns, lo = self.rows, min(window, old_end), self.lo
        for old, new in zip((*old_keys, *old_values), (*self._keys, *self._values), strict=True):
            new[:n, :, end - columns : end] = old[lo : lo + n, :, old_end - columns : old_end]
        self._mask[:n, end - columns : end] = old_mask[lo : lo + n, old_end - columns : old_end]
        self.lo = 0
        shift = end - old_end
        self._first = [f + shift for f in self._first]
        self.end = end
        self.start += shift


def _dynamic(layer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if type(layer) is not DynamicLayer or layer.keys is None or layer.values is None:
        raise SamplerError(f"the KV pool takes full-attention DynamicLayer rows, not {type(layer).__name__}")
    return layer.keys, layer.values


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _columns(window: int) -> int:
    # A little headroom, not doubling: attention over a window strided out of wider rows is slower on CPU
    # (+35 % at 220 of 512 columns, +9 % of 256; benchmarks/RESULTS.md), and moving the window costs one
    # copy of it per `_HEADROOM` steps.
    return max(_MIN_COLUMNS, window + _HEADROOM)
