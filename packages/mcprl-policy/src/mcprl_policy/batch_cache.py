"""The running rows' cache in the decode engine: one interface, two layouts.

`DecodeEngine` keeps its rows' tokens, positions and sampling state; what holds their keys and values is a
`RunningCache`:

- ``pool`` (`mcprl_policy.kv_pool.KVPool`): preallocated buffers written in place; rows join and leave without
  copying the others. Full-attention models only.
- ``concat`` (`ConcatCache`): a transformers ``DynamicCache`` that grows by concatenation each step and is
  re-gathered when rows leave or join (`mcprl_policy.cache_rows`); also batches linear-attention (Qwen3.5) layers.

Both give every row the same keys at the same column offsets under the same mask, so the logits are the same
bits whichever runs (`tests/test_kv_pool.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final, Literal, Protocol, assert_never

import torch
from torch import nn
from transformers import DynamicCache

from mcprl_policy.attention import VARLEN_SDPA
from mcprl_policy.cache_rows import (
    RowState,
    concat_rows,
    has_recurrent_layers,
    pad_left,
    row_state,
    select_rows,
)
from mcprl_policy.errors import SamplerError

__all__ = [
    "POOL_ATTENTION",
    "ConcatCache",
    "Forward",
    "KVLayout",
    "ResolvedLayout",
    "RunningCache",
    "resolve_layout",
]

KVLayout = Literal["auto", "pool", "concat"]
"""``pool`` for full-attention models, ``concat`` otherwise (``auto``), or either forced."""

ResolvedLayout = Literal["pool", "concat"]
"""The layout an engine runs (``auto`` resolved)."""

POOL_ATTENTION: Final = frozenset({"sdpa", VARLEN_SDPA})
"""Attention implementations that take the pool's 4-D boolean mask as it is: ``eager`` would add it to the scores
(``True`` as 1, hiding nothing) and flash attention wants a 2-D padding mask."""


class Forward(Protocol):
    """The model's forward with the engine's fixed arguments (``use_cache``, ``logits_to_keep=1``), or a decode
    step computing the same (`mcprl_policy.lean_decode.LeanDecoder`)."""

    def __call__(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        past_key_values: Any,  # a transformers Cache: DynamicCache or the pool's
    ) -> Any: ...  # a transformers CausalLMOutputWithPast


class RunningCache(Protocol):
    """Keys and values (or recurrent states) of the engine's running rows, in the engine's row order."""

    @property
    def rows(self) -> int: ...

    def step(self, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed ``tokens`` ``(B,)`` at ``positions`` ``(B,)``; the last position's logits ``(B, V)``."""
        ...

    def merge(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        """Append the rows of a prefilled ``cache`` whose attention mask is ``mask`` ``(n, W)``."""
        ...

    def drop(self, keep: Sequence[int]) -> None:
        """Keep only the rows ``keep`` (ascending), in that order."""
        ...

    def row_state(self, row: int) -> tuple[RowState, ...]:
        """Row ``row``'s state per layer (its unmasked columns), copied out."""
        ...


class ConcatCache:
    """The rows' ``DynamicCache`` and its ``(B, W)`` attention mask, both concatenated on every step."""

    def __init__(self, device: torch.device) -> None:
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=device)

    @property
    def rows(self) -> int:
        return int(self._mask.shape[0])

    def step(self, forward: Forward, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(self.rows, 1, dtype=torch.long, device=self._mask.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        out = forward(
            input_ids=tokens[:, None],
            attention_mask=self._mask,
            position_ids=positions[:, None],
            past_key_values=self._cache,
        )
        self._cache = out.past_key_values
        return out.logits[:, -1]

    def merge(self, cache: DynamicCache, mask: torch.Tensor) -> None:
        if self._cache is None or not self.rows:
            self._cache, self._mask = cache, mask
            return
        width = max(self._mask.shape[1], mask.shape[1])
        self._mask = torch.cat([pad_left(self._mask, width), pad_left(mask, width)])
        concat_rows(self._cache, cache, width=width)

    def drop(self, keep: Sequence[int]) -> None:
        if not keep:
            self._cache = None
            self._mask = self._mask[:0, :0]
            return
        index = torch.tensor(keep, dtype=torch.long, device=self._mask.device)
        self._mask = self._mask[index]
        # Columns that are padding in every remaining row are dead weight: trim them.
        first = int(self._mask.any(0).nonzero()[0])
        self._mask = self._mask[:, first:]
        assert self._cache is not None
        select_rows(self._cache, index, first_column=first)

    def row_state(self, row: int) -> tuple[RowState, ...]:
        assert self._cache is not None
        return row_state(self._cache, row, self._mask[row].nonzero().squeeze(-1))


def resolve_layout(requested: KVLayout, model: nn.Module) -> ResolvedLayout:
    """The layout an engine runs for ``model``: ``auto`` is the pool unless the model has linear-attention
    (recurrent) layers or an attention implementation outside `POOL_ATTENTION`.

    Raises:
        SamplerError: ``pool`` requested for such a model.
    """
    recurrent = has_recurrent_layers(model)
    attn_implementation = getattr(getattr(model, "config", None), "_attn_implementation", None)
    match requested:
        case "auto":
            return "concat" if recurrent or attn_implementation not in POOL_ATTENTION else "pool"
        case "pool":
            if recurrent:
                raise SamplerError(
                    "kv_layout='pool' holds full-attention layers only; this model has linear-attention layers "
                    "(use kv_layout='auto' or 'concat')"
                )
            if attn_implementation not in POOL_ATTENTION:
                raise SamplerError(
                    f"kv_layout='pool' hands attention SDPA's boolean mask, which attention implementation "
                    f"{attn_implementation!r} does not take (it needs one of {sorted(POOL_ATTENTION)}; or use "
                    "kv_layout='auto' or 'concat')"
                )
            return "pool"
        case "concat":
            return "concat"
        case unreachable:
            assert_never(unreachable)
