"""TokenMask and PackedLayout: validated once, then every function gives what the bare tensors give."""

from __future__ import annotations

import pytest
import torch
from grpo_testkit import tolist_1d, tolist_2d
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_grpo import (
    AggregationMode,
    ArgumentError,
    DTypeError,
    MaskError,
    PackedLayout,
    TokenMask,
    aggregate_loss,
    aggregation_normalizer,
    expand_to_tokens,
    kl_loss,
)
from mcprl_grpo._segments import packed_sums_and_counts, prefix_at

FAST = settings(max_examples=40, deadline=None)
SEQ_MODES: tuple[AggregationMode, ...] = (
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


@pytest.mark.parametrize("bad", [0.5, 2.0, -1.0, float("nan"), float("inf")])
def test_token_mask_refuses_a_float_mask_with_values_other_than_0_and_1(bad: float) -> None:
    with pytest.raises(MaskError, match="only 0 and 1"):
        TokenMask.of(torch.tensor([[1.0, 0.0, bad]]))


def test_token_mask_holds_bool_weights_and_row_counts_and_is_shape_checked() -> None:
    tm = TokenMask.of(torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 0.0]]))
    assert tm.keep.dtype == torch.bool
    assert tm.weights.dtype == torch.float32
    assert tm.row_counts is not None
    assert tolist_1d(tm.row_counts) == [2.0, 0.0]
    assert TokenMask.of(tm) is tm
    with pytest.raises(MaskError, match=r"build it with TokenMask\.of"):
        TokenMask(keep=torch.ones(2), weights=torch.ones(2), row_counts=None)
    with pytest.raises(ValueError, match="mask has shape"):
        aggregate_loss(torch.zeros(2, 4), tm)


@given(st.integers(1, 7), st.integers(1, 9), st.integers(0, 2**31 - 1), st.booleans())
@FAST
def test_padded_aggregation_with_a_token_mask_equals_the_bool_mask(
    b: int, t: int, seed: int, nan: bool
) -> None:
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=g)
    keep = torch.rand(b, t, generator=g) > 0.4
    if nan:  # masked-out NaN/inf must not reach the result: the fast path falls back to exact masking
        loss = torch.where(keep, loss, torch.tensor(float("nan")))
        loss[0, 0] = float("inf") if not keep[0, 0] else loss[0, 0]
    tm = TokenMask.of(keep.float())
    for mode in ("token-mean", *SEQ_MODES):
        want = aggregate_loss(loss, keep, mode=mode)
        got = aggregate_loss(loss, tm, mode=mode)
        assert torch.isfinite(got)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_token_mask_gradient_equals_the_bool_mask_gradient() -> None:
    g = torch.Generator().manual_seed(3)
    keep = torch.rand(5, 6, generator=g) > 0.5
    for mode in SEQ_MODES:
        grads: list[torch.Tensor] = []
        for mask in (keep, TokenMask.of(keep)):
            loss = torch.randn(5, 6, generator=torch.Generator().manual_seed(4)).requires_grad_()
            aggregate_loss(loss, mask, mode=mode).backward()  # pyright: ignore[reportUnknownMemberType]
            assert loss.grad is not None
            grads.append(loss.grad)
        torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_expand_to_tokens_with_a_token_mask_and_non_finite_advantages() -> None:
    keep = torch.tensor([[True, False, True], [False, True, True]])
    tm = TokenMask.of(keep.to(torch.int64))
    adv = torch.tensor([0.5, -2.0])
    assert tolist_2d(expand_to_tokens(adv, tm)) == tolist_2d(expand_to_tokens(adv, keep))
    nan_adv = torch.tensor([float("nan"), 1.0])
    out = expand_to_tokens(nan_adv, tm)
    assert out[0, 1].item() == 0.0
    assert out[1, 0].item() == 0.0
    assert out[0, 0].isnan()


def test_packed_layout_from_ids_and_from_lengths_agree_and_refuse_bad_ids() -> None:
    lengths = torch.tensor([3, 0, 2, 1])
    a = PackedLayout.from_lengths(lengths)
    b = PackedLayout.from_seq_ids(torch.tensor([0, 0, 0, 2, 2, 3]))
    assert tolist_1d(a.ids) == tolist_1d(b.ids)
    assert tolist_1d(a.offsets) == tolist_1d(b.offsets) == [0, 3, 3, 5, 6]
    assert a.num_seqs == 4
    with pytest.raises(ArgumentError, match="non-decreasing"):
        PackedLayout.from_seq_ids(torch.tensor([0, 1, 0]))
    with pytest.raises(ArgumentError, match="non-negative"):
        PackedLayout.from_seq_ids(torch.tensor([-1, 0]))
    with pytest.raises(ArgumentError, match="non-negative"):
        PackedLayout.from_lengths(torch.tensor([2, -1]))
    with pytest.raises(DTypeError, match="integer"):
        PackedLayout.from_seq_ids(torch.tensor([0.0, 1.0]))
    assert PackedLayout.from_seq_ids(torch.zeros(0, dtype=torch.int64)).num_seqs == 0


@given(st.lists(st.integers(0, 90), min_size=1, max_size=12), st.integers(0, 2**31 - 1))
@FAST
def test_packed_aggregation_with_a_layout_equals_bare_ids_and_padded(lengths: list[int], seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    n = torch.tensor(lengths)
    layout = PackedLayout.from_lengths(n)
    total = int(n.sum())
    loss = torch.randn(total, generator=g, dtype=torch.float64)
    keep = torch.rand(total, generator=g) > 0.3
    loss = torch.where(keep, loss, torch.tensor(float("nan"), dtype=torch.float64))
    t = max(max(lengths), 1)
    padded_loss = torch.zeros(len(lengths), t, dtype=torch.float64)
    padded_keep = torch.zeros(len(lengths), t, dtype=torch.bool)
    for s, (start, length) in enumerate(zip(tolist_1d(layout.offsets), lengths, strict=False)):
        padded_loss[s, :length] = loss[start : start + length]
        padded_keep[s, :length] = keep[start : start + length]
    for mode in SEQ_MODES:
        with_layout = aggregate_loss(loss, keep, mode=mode, max_tokens=t, seq_ids=layout)
        with_ids = aggregate_loss(loss, keep, mode=mode, max_tokens=t, seq_ids=layout.ids)
        padded = aggregate_loss(padded_loss, padded_keep, mode=mode, max_tokens=t)
        torch.testing.assert_close(with_layout, with_ids, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(with_layout, padded, rtol=1e-12, atol=1e-12)
        assert aggregation_normalizer(keep, mode=mode, seq_ids=layout) == aggregation_normalizer(
            padded_keep, mode=mode
        )
    assert torch.isfinite(
        kl_loss(loss, loss, keep, estimator="k3", mode="seq-mean-token-mean", seq_ids=layout)
    )


@given(st.integers(0, 200), st.integers(0, 2**31 - 1))
@FAST
def test_prefix_at_equals_a_running_sum(length: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    v = torch.randn(length, generator=g, dtype=torch.float64)
    mask = torch.rand(length, generator=g) > 0.5
    positions = torch.randint(0, length + 1, (7,), generator=g)
    running = torch.cat([torch.zeros(1, dtype=torch.float64), v.cumsum(0)])
    torch.testing.assert_close(prefix_at(v, positions, torch.float64), running[positions])
    counts = torch.cat([torch.zeros(1, dtype=torch.int64), mask.long().cumsum(0)])
    assert tolist_1d(prefix_at(mask.view(torch.uint8), positions, torch.int64)) == tolist_1d(
        counts[positions]
    )


def test_a_non_finite_token_affects_only_its_own_sequence_sum() -> None:
    offsets = torch.tensor([0, 40, 41, 100, 130])
    x = torch.ones(130)
    x[50] = float("inf")
    sums, counts = packed_sums_and_counts(x, x > 0, offsets)
    assert tolist_1d(sums)[0:2] == [40.0, 1.0]
    assert sums[2].isinf()
    assert sums[3].item() == 30.0
    assert tolist_1d(counts) == [40.0, 1.0, 59.0, 30.0]
    finite_sums, _ = packed_sums_and_counts(torch.arange(130.0), x > 0, offsets)
    assert tolist_1d(finite_sums) == [780.0, 40.0, 59.0 * 70.0, 30.0 * 114.5]


@pytest.mark.parametrize("mode", SEQ_MODES)
def test_packed_gradient_with_a_layout_equals_the_padded_gradient(mode: AggregationMode) -> None:
    lengths = [37, 0, 5, 64, 1, 33]
    layout = PackedLayout.from_lengths(torch.tensor(lengths))
    g = torch.Generator().manual_seed(7)
    values = torch.randn(sum(lengths), generator=g, dtype=torch.float64)
    keep = torch.rand(sum(lengths), generator=g) > 0.3
    packed = values.clone().requires_grad_()
    aggregate_loss(packed, keep, mode=mode, max_tokens=64, seq_ids=layout).backward()  # pyright: ignore[reportUnknownMemberType]
    padded = torch.zeros(len(lengths), 64, dtype=torch.float64)
    padded_keep = torch.zeros(len(lengths), 64, dtype=torch.bool)
    starts = tolist_1d(layout.offsets)
    for s, length in enumerate(lengths):
        padded[s, :length] = values[int(starts[s]) : int(starts[s]) + length]
        padded_keep[s, :length] = keep[int(starts[s]) : int(starts[s]) + length]
    padded.requires_grad_()
    aggregate_loss(padded, padded_keep, mode=mode, max_tokens=64).backward()  # pyright: ignore[reportUnknownMemberType]
    assert packed.grad is not None
    assert padded.grad is not None
    want = torch.cat([padded.grad[s, :length] for s, length in enumerate(lengths)])
    torch.testing.assert_close(packed.grad, want, rtol=1e-12, atol=1e-12)
