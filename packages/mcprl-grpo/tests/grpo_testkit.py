"""Test kit for mcprl-grpo: tensors as typed Python values, for comparisons with plain-Python transcriptions.

torch declares ``Tensor.tolist()`` as returning a bare ``list`` (its depth depends on ``ndim``), so its
elements are Unknown to a type checker. These helpers build the same values from ``Tensor.item()``, which
torch types as ``Number``: each element is exactly what ``tolist()`` would have returned.
"""

from __future__ import annotations

import torch
from torch.types import Number


def tolist_1d(t: torch.Tensor) -> list[Number]:
    """``t.tolist()`` for a 1-D tensor ``(N,)``."""
    if t.dim() != 1:
        raise ValueError(f"expected a 1-D tensor, got shape {tuple(t.shape)}")
    return [v.item() for v in t.unbind()]


def tolist_2d(t: torch.Tensor) -> list[list[Number]]:
    """``t.tolist()`` for a 2-D tensor ``(B, T)``."""
    if t.dim() != 2:
        raise ValueError(f"expected a 2-D tensor, got shape {tuple(t.shape)}")
    return [tolist_1d(row) for row in t.unbind()]
