"""Shared argument checks: shapes, masks, dtypes, and the float32 compute dtype for statistics."""

from __future__ import annotations

import torch

from mcprl_grpo.errors import ArgumentError, DTypeError, ShapeError
from mcprl_grpo.token_mask import MaskLike, TokenMask, validated_bool

_LOW_PRECISION = (torch.float16, torch.bfloat16)


def stat_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64; everything else (bf16, fp16, fp32, ints, bools) computes in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def as_float(x: torch.Tensor) -> torch.Tensor:
    """`x` in its statistics dtype (float32 unless it already is float64)."""
    return x.to(stat_dtype(x))


def check_float(name: str, x: torch.Tensor) -> None:
    """Raise `DTypeError` unless `x` is a floating-point tensor."""
    if not isinstance(x, torch.Tensor):  # pyright: ignore[reportUnnecessaryIsInstance]
        raise DTypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise DTypeError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")


def check_same_shape(name: str, x: torch.Tensor, ref_name: str, ref: torch.Tensor) -> None:
    """Raise `ShapeError` naming `name` unless `x.shape == ref.shape`."""
    if x.shape != ref.shape:
        raise ShapeError(name, x.shape, f"{tuple(ref.shape)} (the shape of {ref_name})")


def check_ndim(name: str, x: torch.Tensor, ndim: int, layout: str) -> None:
    """Raise `ShapeError` unless `x` has `ndim` dimensions; `layout` is shown, e.g. ``"(B, T)"``."""
    if x.dim() != ndim:
        raise ShapeError(name, x.shape, layout)


def as_mask(name: str, mask: MaskLike, ref_name: str, ref: torch.Tensor | None) -> torch.Tensor:
    """Validate `mask` against `ref` (None: no shape to match) and return it as a bool tensor.

    Accepts bool masks, integer/float masks holding only 0 and 1 (checked on each call by `validated_bool`), or
    a `TokenMask` (validated when it was built).

    Raises:
        ShapeError: the mask's shape differs from `ref`'s.
        MaskError: a non-bool mask holds a value other than 0 or 1.
    """
    tensor = mask.keep if isinstance(mask, TokenMask) else mask
    if ref is not None:
        check_same_shape(name, tensor, ref_name, ref)
    return tensor if isinstance(mask, TokenMask) else validated_bool(name, mask)


def count_true(mask: torch.Tensor, dtype: torch.dtype, *, dim: int | None = None) -> torch.Tensor:
    """Number of true entries of a bool tensor as ``dtype``, over everything or along ``dim``.

    Sums the mask's bytes into int32 along the last dimension (exact below 2^31 entries per row): about 2x
    faster on CPU than torch's bool or int64 reductions of the same tensor.
    """
    b = mask.view(torch.uint8)
    if dim is None:
        whole = b.reshape(-1) if b.dim() < 2 else b
        rows = whole.sum(dim=-1, dtype=torch.int32 if whole.shape[-1] < 2**31 else torch.int64)
        return rows.sum(dtype=torch.int64).to(dtype)
    return b.sum(dim=dim, dtype=torch.int32 if b.shape[dim] < 2**31 else torch.int64).to(dtype)


def check_positive(name: str, value: float) -> None:
    """Raise `ArgumentError` unless `value > 0`."""
    if not value > 0:
        raise ArgumentError(f"{name} must be > 0, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    """Raise `ArgumentError` unless `value >= 0`."""
    if not value >= 0:
        raise ArgumentError(f"{name} must be >= 0, got {value!r}")


def check_unit_interval(name: str, value: float) -> None:
    """Raise `ArgumentError` unless `0 <= value <= 1`."""
    if not 0.0 <= value <= 1.0:
        raise ArgumentError(f"{name} must be in [0, 1], got {value!r}")
