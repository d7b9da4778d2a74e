"""Masked reductions: match their definitions, never NaN on empty masks, padding never leaks."""

from __future__ import annotations

import statistics

import pytest
import torch
from grpo_testkit import tolist_1d
from hypothesis import example, given, settings
from hypothesis import strategies as st

from mcprl_grpo import MaskError, ShapeError, masked_count, masked_mean, masked_sum, masked_var, masked_whiten

FAST = settings(max_examples=50, deadline=None)


@st.composite
def data(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor]:
    n = draw(st.integers(0, 12))
    xs = draw(st.lists(st.floats(-1e3, 1e3), min_size=n, max_size=n))
    ms = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return torch.tensor(xs, dtype=torch.float64), torch.tensor(ms, dtype=torch.bool)


@FAST
@given(data())
@example((torch.zeros(0, dtype=torch.float64), torch.zeros(0, dtype=torch.bool)))
@example((torch.ones(3, dtype=torch.float64), torch.zeros(3, dtype=torch.bool)))
@example((torch.ones(1, dtype=torch.float64), torch.ones(1, dtype=torch.bool)))
def test_reductions_equal_statistics_of_selected_values(d: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, m = d
    sel = tolist_1d(x[m])
    assert masked_sum(x, m).item() == pytest.approx(sum(sel), abs=1e-9)
    assert masked_count(m).item() == len(sel)
    assert masked_mean(x, m).item() == pytest.approx(statistics.fmean(sel) if sel else 0.0, abs=1e-9)
    want_var = statistics.variance(sel) if len(sel) > 1 else 0.0
    assert masked_var(x, m).item() == pytest.approx(want_var, rel=1e-9, abs=1e-6)
    want_pvar = statistics.pvariance(sel) if sel else 0.0
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(want_pvar, rel=1e-9, abs=1e-6)


@FAST
@given(data())
def test_whiten_gives_zero_mean_unit_variance_and_zero_padding(d: tuple[torch.Tensor, torch.Tensor]) -> None:
    x, m = d
    w = masked_whiten(x, m)
    assert not torch.isnan(w).any()
    assert torch.equal(w[~m], torch.zeros_like(w[~m]))
    sel = tolist_1d(w[m])
    if len(sel) > 1 and statistics.variance(tolist_1d(x[m])) > 1e-3:
        assert statistics.fmean(sel) == pytest.approx(0.0, abs=1e-9)
        assert statistics.variance(sel) == pytest.approx(1.0, rel=1e-6)
        kept = masked_whiten(x, m, shift_mean=False)
        mean = statistics.fmean(tolist_1d(x[m]))
        torch.testing.assert_close(kept[m], w[m] + mean, atol=1e-9, rtol=1e-9)


def test_nan_padding_leaks_into_neither_value_nor_gradient() -> None:
    x = torch.tensor([[1.0, float("nan")], [3.0, float("inf")]], dtype=torch.float64, requires_grad=True)
    m = torch.tensor([[True, False], [True, False]])
    total = masked_mean(x, m) + masked_var(x, m) + masked_sum(x, m, dim=1).sum() + masked_whiten(x, m).sum()
    torch.autograd.backward(total)
    assert x.grad is not None
    assert torch.isfinite(total)
    assert torch.isfinite(x.grad).all()
    assert x.grad[0, 1].item() == 0.0
    assert x.grad[1, 1].item() == 0.0


def test_empty_rows_reduce_to_zero_per_dimension() -> None:
    x = torch.tensor([[1.0, 2.0], [5.0, 6.0]])
    m = torch.tensor([[1, 1], [0, 0]])
    assert tolist_1d(masked_mean(x, m, dim=1)) == [1.5, 0.0]
    assert tolist_1d(masked_var(x, m, dim=1)) == [0.5, 0.0]
    assert masked_sum(x, m, dim=1, keepdim=True).shape == (2, 1)


def test_bf16_statistics_are_float32() -> None:
    x = torch.tensor([1.0, 2.0, 3.0], dtype=torch.bfloat16)
    assert masked_mean(x, torch.ones(3)).dtype == torch.float32


def test_bad_masks_raise_typed_errors() -> None:
    with pytest.raises(ShapeError, match=r"mask has shape \(2,\), expected \(3,\)"):
        masked_mean(torch.zeros(3), torch.ones(2))
    with pytest.raises(MaskError, match="mask"):
        masked_mean(torch.zeros(3), torch.tensor([0.0, 0.5, 1.0]))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize(
    "bad", [0.5, float("nan"), float("inf"), -float("inf"), 2.0, -1.0, 1.0078125, "subnormal"]
)
def test_float_mask_with_any_value_but_0_and_1_raises(dtype: torch.dtype, bad: float | str) -> None:
    value = torch.finfo(dtype).tiny / 2 if bad == "subnormal" else float(bad)
    mask = torch.tensor([1.0, 0.0, value, 1.0], dtype=dtype)
    assert mask[2].item() not in (0.0, 1.0)
    with pytest.raises(MaskError, match="only 0 and 1"):
        masked_mean(torch.zeros(4), mask)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("bad", [2, -1, 127])
def test_integer_mask_with_any_value_but_0_and_1_raises(dtype: torch.dtype, bad: int) -> None:
    with pytest.raises(MaskError, match="only 0 and 1"):
        masked_sum(torch.zeros(3), torch.tensor([1, bad, 0]).to(dtype))
    if dtype in (torch.int32, torch.int64):
        with pytest.raises(MaskError, match="only 0 and 1"):
            masked_sum(torch.zeros(2), torch.tensor([1, 1 << 16], dtype=dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.uint8, torch.bool])
def test_0_1_masks_of_every_dtype_agree_with_the_bool_mask(dtype: torch.dtype) -> None:
    x = torch.tensor([1.0, float("nan"), 3.0, -2.0])
    keep = torch.tensor([True, False, True, True])
    mask = keep.to(dtype)
    if dtype == torch.float32:
        mask[1] = -0.0
    assert masked_sum(x, mask).item() == 2.0
    assert masked_mean(x, mask).item() == masked_mean(x, keep).item()
