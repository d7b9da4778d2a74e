"""Aggregation modes equal their definitions; global normalisers make micro-batching exact (float64)."""

from __future__ import annotations

import random

import pytest
import torch
from grpo_testkit import tolist_2d
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcprl_grpo import AggregationMode, ArgumentError, aggregate_loss, aggregation_normalizer

FAST = settings(max_examples=50, deadline=None)
MODES: tuple[AggregationMode, ...] = (
    "token-mean",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


@st.composite
def losses(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    b, t = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    vals = draw(st.lists(st.floats(-100, 100), min_size=b * t, max_size=b * t))
    mask = draw(st.lists(st.booleans(), min_size=b * t, max_size=b * t))
    return torch.tensor(vals, dtype=torch.float64).reshape(b, t), torch.tensor(mask).reshape(b, t)


def definition(loss: torch.Tensor, mask: torch.Tensor, mode: str, max_tokens: int) -> float:
    rows = [
        [v for v, m in zip(lr, mr, strict=True) if m]
        for lr, mr in zip(tolist_2d(loss), tolist_2d(mask), strict=True)
    ]
    rows = [r for r in rows if r]
    if not rows:
        return 0.0
    match mode:
        case "token-mean":
            return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
        case "seq-mean-token-mean":
            return sum(sum(r) / len(r) for r in rows) / len(rows)
        case "seq-mean-token-sum":
            return sum(sum(r) for r in rows) / len(rows)
        case _:
            return sum(sum(r) for r in rows) / (len(rows) * max_tokens)


@FAST
@given(losses(), st.sampled_from(MODES))
@example((torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, 3, dtype=torch.bool)), "token-mean")
@example(
    (torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool)), "seq-mean-token-sum-norm"
)
def test_each_mode_equals_its_definition(
    data: tuple[torch.Tensor, torch.Tensor], mode: AggregationMode
) -> None:
    loss, mask = data
    got = aggregate_loss(loss, mask, mode=mode)
    assert got.item() == pytest.approx(definition(loss, mask, mode, loss.shape[1]), rel=1e-12, abs=1e-12)


@FAST
@given(losses(), st.sampled_from(MODES), st.randoms(use_true_random=False))
def test_sum_over_micro_batches_with_global_normaliser_equals_full_batch(
    data: tuple[torch.Tensor, torch.Tensor], mode: AggregationMode, rnd: random.Random
) -> None:
    loss, mask = data
    b, t = loss.shape
    order = list(range(b))
    rnd.shuffle(order)
    cuts = sorted(rnd.sample(range(1, b), rnd.randint(0, b - 1))) if b > 1 else []
    parts = [order[i:j] for i, j in zip([0, *cuts], [*cuts, b], strict=True)]
    total_norm = sum(float(aggregation_normalizer(mask[p], mode=mode)) for p in parts)
    full = aggregate_loss(loss, mask, mode=mode)
    if total_norm == 0:
        assert full.item() == 0.0
        return
    # Micro-batches may also be padded to a different length: pad each with masked-out garbage.
    summed = sum(
        aggregate_loss(
            torch.cat([loss[p], torch.full((len(p), k), 1e9, dtype=torch.float64)], dim=1),
            torch.cat([mask[p], torch.zeros(len(p), k, dtype=torch.bool)], dim=1),
            mode=mode,
            normalizer=total_norm,
            max_tokens=t,
        )
        for k, p in enumerate(parts)
    )
    assert float(summed) == pytest.approx(full.item(), rel=1e-10, abs=1e-10)


@FAST
@given(losses(), st.sampled_from(MODES))
def test_packed_layout_equals_padded_layout(
    data: tuple[torch.Tensor, torch.Tensor], mode: AggregationMode
) -> None:
    loss, mask = data
    b, t = loss.shape
    lengths = mask.sum(dim=1)
    packed_loss = loss[mask]
    seq_ids = torch.arange(b).repeat_interleave(lengths)
    packed = aggregate_loss(
        packed_loss, torch.ones_like(packed_loss, dtype=torch.bool), mode=mode, seq_ids=seq_ids, max_tokens=t
    )
    assert packed.item() == pytest.approx(aggregate_loss(loss, mask, mode=mode).item(), rel=1e-12, abs=1e-12)


def test_empty_mask_gives_zero_and_zero_gradient() -> None:
    loss = torch.full((2, 2), float("nan"), dtype=torch.float64, requires_grad=True)
    for mode in MODES:
        out = aggregate_loss(loss, torch.zeros(2, 2, dtype=torch.bool), mode=mode)
        (grad,) = torch.autograd.grad(out, loss)
        assert out.item() == 0.0
        assert torch.equal(grad, torch.zeros_like(grad))


def test_bad_normaliser_and_packed_norm_mode_without_max_tokens_raise() -> None:
    loss = torch.ones(3)
    with pytest.raises(ArgumentError, match="normalizer"):
        aggregate_loss(loss, torch.ones(3), normalizer=0.0)
    with pytest.raises(ArgumentError, match="max_tokens"):
        aggregate_loss(
            loss, torch.ones(3), mode="seq-mean-token-sum-norm", seq_ids=torch.zeros(3, dtype=torch.long)
        )


@pytest.mark.parametrize("mode", MODES)
@FAST
@given(data=losses(), seed=st.integers(0, 2**16))
def test_packed_tokens_in_any_order_equal_the_sorted_packing(
    mode: AggregationMode, data: tuple[torch.Tensor, torch.Tensor], seed: int
) -> None:
    loss, mask = data
    b, t = loss.shape
    seq_ids = torch.arange(b).repeat_interleave(t)
    order = torch.randperm(b * t, generator=torch.Generator().manual_seed(seed))
    flat, flat_mask = loss.reshape(-1), mask.reshape(-1)
    sorted_value = aggregate_loss(flat, flat_mask, mode=mode, seq_ids=seq_ids, max_tokens=t)
    shuffled = aggregate_loss(flat[order], flat_mask[order], mode=mode, seq_ids=seq_ids[order], max_tokens=t)
    assert shuffled.item() == pytest.approx(sorted_value.item(), rel=1e-12, abs=1e-12)
    assert sorted_value.item() == pytest.approx(
        aggregate_loss(loss, mask, mode=mode).item(), rel=1e-12, abs=1e-12
    )
