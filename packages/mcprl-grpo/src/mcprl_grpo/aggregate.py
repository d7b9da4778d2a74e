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

from mcprl_grpo._checks import as_float, as_mask, check_float, check_positive
from mcprl_grpo._segments import segment_sum, segments
from mcprl_grpo.choices import AggregationMode as AggregationMode
from mcprl_grpo.errors import ArgumentError


def _denominator(local: torch.Tensor, normalizer: float | torch.Tensor | None) -> torch.Tensor:
    if normalizer is None:
        return local.clamp(min=1.0)
    n = torch.as_tensor(normalizer, dtype=local.dtype, device=local.device)
    if not bool(n > 0):
        raise ArgumentError(f"normalizer must be > 0, got {float(n)!r}")
    return n


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    *,
    mode: AggregationMode = "token-mean",
    normalizer: float | torch.Tensor | None = None,
    max_tokens: int | None = None,
    seq_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce per-token losses ``ℓ_{i,t}`` over the mask to a scalar.

    With ``M_i`` the masked tokens of sequence ``i``, ``S`` the sequences with ``|M_i| > 0`` and ``N = Σ|M_i|``:

    - ``"token-mean"``: ``Σ_i Σ_{t∈M_i} ℓ_{i,t} / N`` (DAPO, Yu et al. 2025, eq. 10: token-level loss).
    - ``"seq-mean-token-mean"``: ``1/|S| Σ_i 1/|M_i| Σ_t ℓ_{i,t}`` (GRPO, Shao et al. 2024, eq. 3).
    - ``"seq-mean-token-sum"``: ``1/|S| Σ_i Σ_t ℓ_{i,t}``.
    - ``"seq-mean-token-sum-norm"``: ``1/(|S| · L_max) Σ_i Σ_t ℓ_{i,t}`` with a constant ``L_max`` (Dr. GRPO,
      Liu et al. 2025, "Understanding R1-Zero-Like Training", §3.1: no length normalisation, divide by the
      generation budget). verl's mode of the same name divides by ``L_max`` only; multiply by ``|S|`` for it.

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
    lf = as_float(loss)
    zero = torch.zeros((), dtype=lf.dtype, device=lf.device)
    x = torch.where(m, lf, zero)
    if mode == "token-mean":
        return x.sum() / _denominator(m.sum().to(lf.dtype), normalizer)
    mf = m.to(lf.dtype)
    ids, n = segments(x, seq_ids, name="loss")
    seq_sum = segment_sum(x, ids, n)
    seq_len = segment_sum(mf, ids, n)
    num_seqs = (seq_len > 0).to(lf.dtype).sum()
    match mode:
        case "seq-mean-token-mean":
            return (seq_sum / seq_len.clamp(min=1.0)).sum() / _denominator(num_seqs, normalizer)
        case "seq-mean-token-sum":
            return seq_sum.sum() / _denominator(num_seqs, normalizer)
        case "seq-mean-token-sum-norm":
            if max_tokens is None:
                if seq_ids is not None:
                    raise ArgumentError(
                        "max_tokens is required for packed (L,) input in seq-mean-token-sum-norm"
                    )
                max_tokens = loss.shape[-1]
            check_positive("max_tokens", max_tokens)
            return seq_sum.sum() / (_denominator(num_seqs, normalizer) * max_tokens)
        case _:
            assert_never(mode)


def aggregation_normalizer(
    mask: torch.Tensor, *, mode: AggregationMode = "token-mean", seq_ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The local denominator `aggregate_loss` would use (tokens or non-empty sequences), as float32.

    Sum it over every micro-batch of an optimizer step (and all-reduce across ranks) to get the global
    ``normalizer``.
    """
    m = as_mask("mask", mask, "mask", mask)
    mf = m.to(torch.float32)
    match mode:
        case "token-mean":
            return mf.sum()
        case "seq-mean-token-mean" | "seq-mean-token-sum" | "seq-mean-token-sum-norm":
            ids, n = segments(mf, seq_ids, name="mask")
            return (segment_sum(mf, ids, n) > 0).to(torch.float32).sum()
        case _:
            assert_never(mode)
