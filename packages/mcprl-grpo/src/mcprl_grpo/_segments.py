"""Sequence structure of token tensors: padded ``(B, T)`` or packed ``(L,)`` with ``seq_ids``.

Reductions per sequence use ``index_add_`` over a flat view, so both layouts share one code path.
"""

from __future__ import annotations

import torch

from mcprl_grpo.errors import DTypeError, ShapeError


def segments(x: torch.Tensor, seq_ids: torch.Tensor | None, *, name: str = "x") -> tuple[torch.Tensor, int]:
    """Flat ``(numel,)`` sequence index for every entry of ``x`` and the number of sequences.

    ``(B, T)`` tensors need no ``seq_ids`` (row ``b`` is sequence ``b``); packed ``(L,)`` tensors need
    ``seq_ids`` ``(L,)`` integers in ``[0, S)``.
    """
    if seq_ids is None:
        if x.dim() != 2:
            raise ShapeError(name, x.shape, "(B, T), or packed (L,) together with seq_ids (L,)")
        b, t = x.shape
        return torch.arange(b, device=x.device).repeat_interleave(t), b
    if seq_ids.shape != x.shape or x.dim() != 1:
        raise ShapeError("seq_ids", seq_ids.shape, f"{tuple(x.shape)} with {name} packed as (L,)")
    if seq_ids.is_floating_point() or seq_ids.dtype == torch.bool:
        raise DTypeError(f"seq_ids must be an integer tensor, got dtype {seq_ids.dtype}")
    ids = seq_ids.long()
    if ids.numel() and int(ids.min()) < 0:
        raise ShapeError("seq_ids", seq_ids.shape, "non-negative integer ids")
    return ids, (int(ids.max()) + 1 if ids.numel() else 0)


def segment_sum(x: torch.Tensor, ids: torch.Tensor, n: int) -> torch.Tensor:
    """``(n,)`` sums of the flattened ``x`` per sequence id."""
    flat = x.reshape(-1)
    return flat.new_zeros(n).index_add(0, ids, flat)
