"""Typed entry points for the few torch APIs whose annotations leave a type Unknown.

torch declares ``Tensor.tolist()`` as a bare ``list`` (its depth depends on ``ndim``), and leaves the
parameters of ``torch.manual_seed`` and ``Optimizer.step`` unannotated. Each gap is bridged here, once, so the
rest of the package is checked strictly.
"""

from __future__ import annotations

from typing import TypeVar

import torch

__all__ = ["manual_seed", "optimizer_step", "tensor_list"]

T = TypeVar("T", int, float, bool)


def tensor_list(t: torch.Tensor, _element: type[T]) -> list[T]:
    """``t.tolist()`` of a 1-D tensor `(N,)` whose elements are ``T``."""
    return t.tolist()  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]


def manual_seed(seed: int) -> None:
    """``torch.manual_seed(seed)``: seed torch's generators on every device."""
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType]


def optimizer_step(optimizer: torch.optim.Optimizer) -> None:
    """``optimizer.step()`` (no closure)."""
    optimizer.step()  # pyright: ignore[reportUnknownMemberType]
