"""Masked reductions that never produce NaN on empty masks.

Every function takes a tensor ``x`` of any shape and a mask of the same shape (bool, or 0/1). Entries where the
mask is false are replaced by zero *before* any arithmetic (`zero_outside`, as ``torch.where``; not ``x * mask``), so NaN or inf
in padding can neither leak into a result nor into a gradient. Statistics are computed in float32 (float64
inputs stay float64), so bf16/fp16 inputs are safe; results come back in that statistics dtype.
"""

from __future__ import annotations

import torch

from mcprl_grpo._checks import as_float, as_mask, check_float, check_non_negative
from mcprl_grpo._select import zero_outside
from mcprl_grpo.token_mask import MaskLike

Dim = int | tuple[int, ...] | None


def _prepare(x: torch.Tensor, mask: MaskLike) -> tuple[torch.Tensor, torch.Tensor]:
    check_float("x", x)
    m = as_mask("mask", mask, "x", x)
    return zero_outside(as_float(x), m), m


def _sum(x: torch.Tensor, dim: Dim, keepdim: bool) -> torch.Tensor:
    if dim is None:
        return x.sum()
    return x.sum(dim=dim, keepdim=keepdim)


def masked_sum(x: torch.Tensor, mask: MaskLike, *, dim: Dim = None, keepdim: bool = False) -> torch.Tensor:
    """Sum of ``x`` over entries where ``mask`` is true.

    Args:
        x: Values, any shape ``(...)``.
        mask: Same shape as ``x``; bool or 0/1.
        dim: Dimension(s) to reduce; None reduces everything to a scalar.
        keepdim: Keep reduced dimensions with size 1.

    Returns:
        The masked sum (0 where nothing is selected), in float32 (float64 for float64 input).
    """
    xz, _ = _prepare(x, mask)
    return _sum(xz, dim, keepdim)


def masked_count(mask: MaskLike, *, dim: Dim = None, keepdim: bool = False) -> torch.Tensor:
    """Number of true entries of ``mask`` (float32), reduced like `masked_sum`."""
    m = as_mask("mask", mask, "mask", None)
    return _sum(m.to(torch.float32), dim, keepdim)


def masked_mean(x: torch.Tensor, mask: MaskLike, *, dim: Dim = None, keepdim: bool = False) -> torch.Tensor:
    """Mean of ``x`` over entries where ``mask`` is true; 0 (not NaN) where nothing is selected.

    Args:
        x: Values, any shape ``(...)``.
        mask: Same shape as ``x``; bool or 0/1.
        dim: Dimension(s) to reduce; None reduces everything to a scalar.
        keepdim: Keep reduced dimensions with size 1.

    Returns:
        ``sum(x·m) / max(sum(m), 1)`` in float32 (float64 for float64 input).
    """
    xz, m = _prepare(x, mask)
    total = _sum(xz, dim, keepdim)
    count = _sum(m.to(xz.dtype), dim, keepdim)
    return total / count.clamp(min=1.0)


def masked_var(
    x: torch.Tensor, mask: MaskLike, *, dim: Dim = None, keepdim: bool = False, unbiased: bool = True
) -> torch.Tensor:
    """Variance of ``x`` over entries where ``mask`` is true; 0 (not NaN) when too few entries are selected.

    Two-pass (mean first, then squared deviations) for numerical stability.

    Args:
        x: Values, any shape ``(...)``.
        mask: Same shape as ``x``; bool or 0/1.
        dim: Dimension(s) to reduce; None reduces everything to a scalar.
        keepdim: Keep reduced dimensions with size 1.
        unbiased: Divide by ``n - 1`` (Bessel) instead of ``n``; with ``n <= 1`` the result is 0.

    Returns:
        The masked variance in float32 (float64 for float64 input).
    """
    xz, m = _prepare(x, mask)
    mf = m.to(xz.dtype)
    count = _sum(mf, dim, True)
    mean = _sum(xz, dim, True) / count.clamp(min=1.0)
    dev = zero_outside(xz - mean, m)
    sq = _sum(dev * dev, dim, keepdim)
    if not keepdim:
        count = _sum(mf, dim, False)
    denom = count - 1.0 if unbiased else count
    return torch.where(denom > 0, sq / denom.clamp(min=1.0), torch.zeros_like(sq))


def masked_whiten(
    x: torch.Tensor, mask: MaskLike, *, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise ``x`` to zero mean and unit variance over the masked entries (all dimensions together).

    ``(x - mean) / sqrt(var + eps)`` with the unbiased masked variance; with ``shift_mean=False`` the mean is
    added back (scale only). Entries outside the mask are 0 in the output.

    Args:
        x: Values, any shape ``(...)``.
        mask: Same shape as ``x``; bool or 0/1.
        shift_mean: Subtract the mean (True) or keep it (False).
        eps: Added to the variance before the square root.

    Returns:
        Same shape as ``x``, float32 (float64 for float64 input).
    """
    check_non_negative("eps", eps)
    xz, m = _prepare(x, mask)
    mean = masked_mean(xz, m)
    var = masked_var(xz, m)
    out = (xz - mean) * torch.rsqrt(var + eps) if eps > 0 or bool(var > 0) else xz - mean
    if not shift_mean:
        out = out + mean
    return zero_outside(out, m)
