"""Reducing per-token losses to a scalar: the four aggregation modes and micro-batch-exact normalisers.

Per-token losses are ``(B, T)`` (row = sequence) or packed ``(L,)`` with ``seq_ids`` ``(L,)``. Only sequences with
at least one masked-in token count as sequences. With gradient accumulation, pass the *global* denominator
(``normalizer``: the token count of the whole optimizer batch for ``"token-mean"``, its sequence count for the
``seq-*`` modes) to every micro-batch; the sum of the micro-batch losses is then exactly the full-batch loss,
whatever the split.
"""

from __future__ import annotations

from typing import assert_never

import torch

from mcprl_grpo._checks import as_float, as_mask, check_float, check_ndim, check_positive, count_true
from mcprl_grpo._segments import sums_and_counts
from mcprl_grpo._select import zero_outside
from mcprl_grpo.choices import AggregationMode as AggregationMode
from mcprl_grpo.errors import ArgumentError
from mcprl_grpo.packed_layout import SeqIds
from mcprl_grpo.token_mask import MaskLike, TokenMask


def _denominator(local: torch.Tensor, normalizer: float | torch.Tensor | None) -> torch.Tensor:
    if normalizer is None:
        return local.clamp(min=1.0)
    n = torch.as_tensor(normalizer, dtype=local.dtype, device=local.device)
    if not bool(n > 0):
        raise ArgumentError(f"normalizer must be > 0, got {float(n)!r}")
    return n


def aggregate_loss(
    loss: torch.Tensor,
    mask: MaskLike,
    *,
    mode: AggregationMode = "token-mean",
    normalizer: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
    seq_ids: SeqIds | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``ℓ_{i,t}`` over the mask to a scalar.

    With ``M_i`` the masked tokens of sequence ``i``, ``S`` the sequences with ``|M_i| > 0`` and ``N = Σ|M_i|``:

    - ``"token-mean"``: ``Σ_i Σ_{t∈M_i} ℓ_{i,t} / N`` (DAPO, Yu et al. 2025, eq. 10: token-level loss).
    - ``"seq-mean-token-mean"``: ``1/|S| Σ_i 1/|M_i| Σ_t ℓ_{i,t}`` (GRPO, Shao et al. 2024, eq. 3).
    - ``"seq-mean-token-sum"``: ``1/|S| Σ_i Σ_t ℓ_{i,t}``.
    - ``"seq-mean-token-sum-norm"``: ``1/(|S| · L_max) Σ_i Σ_t ℓ_{i,t}`` with a constant ``L_max`` (Dr. GRPO,
      Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1: no length normalisation, divide by the
      generation budget). verl 0.9's ``agg_loss`` mode of the same name is this one (earlier verl divided by
      ``L_max`` only).

    Args:
        loss: ``(B, T)``, or packed ``(L,)`` with ``seq_ids``.
        mask: Same shape; bool or 0/1. Masked-out entries (even NaN/inf) never affect value or gradient.
        mode: Aggregation mode.
        normalizer: Global denominator replacing ``N`` (token-mean) or ``|S|`` (seq modes); use it so that the
            sum over micro-batches equals the full-batch value.
        max_tokens: ``L_max`` for ``"seq-mean-token-sum-norm"``; default ``T`` for ``(B, T)``, required for packed
            input. Keep it constant across micro-batches and steps.
        seq_ids: ``(L,)`` sequence index of each packed token; None for ``(B, T)``.

    Returns:
        Scalar tensor (float32, float64 for float64 input); 0 when the mask is empty.
    """
    check_float("loss", loss)
    m = as_mask("mask", mask, "loss", loss)
    x = as_float(loss)
    if isinstance(mask, TokenMask) and mode != "token-mean" and seq_ids is None:
        row_sums = _weighted_row_sums(x, mask)
        if row_sums is not None:
            budget = x.shape[-1] if max_tokens is None else max_tokens
            return _reduce_sequences(*row_sums, mode=mode, normalizer=normalizer, max_tokens=budget)
    return reduce_zeroed(
        zero_outside(x, m),
        m,
        mode=mode,
        normalizer=normalizer,
        max_tokens=max_tokens,
        seq_ids=seq_ids,
    )


def _weighted_row_sums(x: torch.Tensor, mask: TokenMask) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Per-row sums and counts of a ``(B, T)`` ``x`` over a validated mask, as ``x · weights``; None when unsafe.

    ``x · 1 = x`` and ``x · 0 = ±0`` for finite ``x``, so the sums equal those of the zeroed ``x`` whenever every
    row sum is finite; a NaN or inf anywhere in a row makes its sum non-finite, and the caller then takes the
    exact masking path, which keeps masked-out NaN/inf out of the result.
    """
    if mask.row_counts is None or x.dim() != 2:
        return None
    w = mask.weights if mask.weights.dtype == x.dtype else mask.weights.to(x.dtype)
    sums = (x * w).sum(dim=-1)
    if not bool(torch.isfinite(sums).all()):
        return None
    return sums, mask.row_counts.to(x.dtype)


def reduce_zeroed(
    x: torch.Tensor,
    m: torch.Tensor,
    *,
    mode: AggregationMode,
    normalizer: float | torch.Tensor | None,
    max_tokens: int | None,
    seq_ids: SeqIds | None,
) -> torch.Tensor:
    """`aggregate_loss` for a float32/float64 ``x`` that is already exactly 0 outside the bool mask ``m``.

    The package's per-token functions return such tensors; reducing them here skips a second masking pass.
    """
    if mode == "token-mean":
        return x.sum() / _denominator(count_true(m, x.dtype), normalizer)
    if max_tokens is None and seq_ids is None:
        max_tokens = x.shape[-1]
    seq_sum, seq_len = sums_and_counts(x, m, seq_ids, name="loss")
    return _reduce_sequences(seq_sum, seq_len, mode=mode, normalizer=normalizer, max_tokens=max_tokens)


def _reduce_sequences(
    seq_sum: torch.Tensor,
    seq_len: torch.Tensor,
    *,
    mode: AggregationMode,
    normalizer: float | torch.Tensor | None,
    max_tokens: int | None,
) -> torch.Tensor:
    """The seq-* modes from per-sequence sums and token counts (``max_tokens`` None only for packed input)."""
    num_seqs = count_true(seq_len > 0, seq_sum.dtype)
    match mode:
        case "seq-mean-token-mean":
            return (seq_sum / seq_len.clamp(min=1.0)).sum() / _denominator(num_seqs, normalizer)
        case "seq-mean-token-sum":
            return seq_sum.sum() / _denominator(num_seqs, normalizer)
        case "seq-mean-token-sum-norm":
            if max_tokens is None:
                raise ArgumentError("max_tokens is required for packed (L,) input in seq-mean-token-sum-norm")
            check_positive("max_tokens", max_tokens)
            return seq_sum.sum() / (_denominator(num_seqs, normalizer) * max_tokens)
        case "token-mean":
            return seq_sum.sum() / _denominator(seq_len.sum(), normalizer)
        case _:
            assert_never(mode)


def aggregation_normalizer(
    mask: MaskLike, *, mode: AggregationMode = "token-mean", seq_ids: SeqIds | None = None
) -> torch.Tensor:
    """The local denominator `aggregate_loss` would use (tokens or non-empty sequences), as float32.

    Sum it over every micro-batch of an optimizer step (and all-reduce across ranks) to get the global
    ``normalizer``.
    """
    m = as_mask("mask", mask, "mask", None)
    match mode:
        case "token-mean":
            return count_true(m, torch.float32)
        case "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm":
            if seq_ids is None:
                check_ndim("mask", m, 2, "(B, T), or packed (L,) together with seq_ids (L,)")
                return count_true(count_true(m, torch.int32, dim=-1) > 0, torch.float32)
            _, counts = sums_and_counts(m.to(torch.float32), m, seq_ids, name="mask")
            return count_true(counts > 0, torch.float32)
        case _:
            assert_never(mode)
