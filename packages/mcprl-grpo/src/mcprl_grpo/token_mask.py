"""A token mask validated once where the batch is built, so that the per-token functions trust it on every call.

Every function that takes a mask accepts a plain tensor (bool, or integer/float holding only 0 and 1) and checks
a non-bool one on each call: one fused pass over its values. A learner that passes the same float mask to several
functions per micro-batch pays that pass each time; `TokenMask.of` pays it once and keeps what the hot functions
use: the bool mask, the same mask as float32 0/1 weights, and for a padded ``(B, T)`` mask the per-row counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from mcprl_grpo.errors import MaskError


def validated_bool(name: str, mask: torch.Tensor) -> torch.Tensor:
    """``mask`` as a bool tensor, raising `MaskError` unless it is bool or holds only 0 and 1.

    A bool mask is valid by its dtype and is returned as it is, without reading its values. Any other mask is
    checked in one fused pass: ``v - v·v`` is exactly 0 only for ``v`` in {0, 1} (NaN, inf and every other float
    give a nonzero result, subnormals included; in integer wrap-around too, since ``v`` and ``1 - v`` are coprime).
    """
    if mask.dtype == torch.bool:
        return mask
    if mask.is_complex():
        raise MaskError(f"{name} must be bool or 0/1, got complex dtype {mask.dtype}")
    if mask.numel() and int(torch.count_nonzero(torch.addcmul(mask, mask, mask, value=-1))):
        raise MaskError(f"{name} must hold only 0 and 1 (or be bool); found other values")
    return mask.bool()


@dataclass(frozen=True, eq=False)
class TokenMask:
    """A validated token mask: ``keep`` (bool), ``weights`` (float32 0/1, the same mask), ``row_counts``.

    Build it with `TokenMask.of`; ``row_counts`` is the float32 ``(B,)`` number of true entries per row for a
    ``(B, T)`` mask and None otherwise.
    """

    keep: torch.Tensor
    weights: torch.Tensor
    row_counts: torch.Tensor | None

    def __post_init__(self) -> None:
        if self.keep.dtype != torch.bool or self.weights.dtype != torch.float32:
            raise MaskError(
                f"TokenMask holds a bool keep and float32 weights, got {self.keep.dtype} and "
                f"{self.weights.dtype}; build it with TokenMask.of(mask)"
            )
        if self.weights.shape != self.keep.shape:
            raise MaskError(
                f"TokenMask weights {tuple(self.weights.shape)} differ from keep {tuple(self.keep.shape)}"
            )

    @classmethod
    def of(cls, mask: torch.Tensor | TokenMask) -> TokenMask:
        """Validate ``mask`` (bool, or integer/float holding only 0 and 1) once; a `TokenMask` is returned as is.

        Raises:
            MaskError: a non-bool mask holds a value other than 0 or 1.
        """
        if isinstance(mask, TokenMask):
            return mask
        keep = validated_bool("mask", mask)
        weights = mask if mask.dtype == torch.float32 else keep.to(torch.float32)
        counts = weights.sum(dim=-1) if weights.dim() == 2 else None
        return cls(keep=keep, weights=weights, row_counts=counts)

    @property
    def shape(self) -> torch.Size:
        return self.keep.shape


MaskLike = torch.Tensor | TokenMask
