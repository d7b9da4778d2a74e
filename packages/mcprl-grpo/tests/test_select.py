"""`zero_outside` is ``torch.where(mask, x, 0)`` bit for bit, in value and in gradient, whatever lies outside."""

from __future__ import annotations

import pytest
import torch
from grpo_testkit import Number, tolist_1d
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_grpo._select import zero_outside

FAST = settings(max_examples=60, deadline=None)
SPECIAL = (float("nan"), float("inf"), -float("inf"), -0.0, 5e-324, 1e300)


@st.composite
def masked(draw: st.DrawFn) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    shape = draw(st.sampled_from([(0,), (1,), (7,), (3, 5), (2, 3, 4)]))
    n = 1
    for s in shape:
        n *= s
    keep = torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=torch.bool).reshape(
        shape
    )
    vals = draw(st.lists(st.one_of(st.floats(-1e6, 1e6), st.sampled_from(SPECIAL)), min_size=n, max_size=n))
    grads = draw(st.lists(st.one_of(st.floats(-10, 10), st.sampled_from(SPECIAL)), min_size=n, max_size=n))
    x = torch.tensor(vals, dtype=torch.float64).reshape(shape)
    return x, keep, torch.tensor(grads, dtype=torch.float64).reshape(shape)


def _where(x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return torch.where(keep, x, torch.zeros((), dtype=x.dtype))


def _bits(x: torch.Tensor) -> list[Number]:
    ints = {8: torch.int64, 4: torch.int32, 2: torch.int16}[x.element_size()]
    return tolist_1d(x.detach().reshape(-1).view(ints))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@FAST
@given(case=masked())
def test_value_and_gradient_equal_torch_where_bit_for_bit(
    dtype: torch.dtype, case: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
) -> None:
    x64, keep, g64 = case
    x = x64.to(dtype).requires_grad_()
    ours, ref = zero_outside(x, keep), _where(x, keep)
    assert _bits(ours) == _bits(ref)
    (g_ours,) = torch.autograd.grad(ours, x, g64.to(dtype))
    (g_ref,) = torch.autograd.grad(ref, x, g64.to(dtype))
    assert _bits(g_ours) == _bits(g_ref)


def test_second_order_gradients_and_strided_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    keep = torch.rand(4, 5, generator=gen) > 0.4

    def squared_inside(v: torch.Tensor) -> torch.Tensor:
        return zero_outside(v * v, keep)

    assert torch.autograd.gradgradcheck(squared_inside, (x,))
    broadcast = torch.randn(4, dtype=torch.float64, generator=gen).unsqueeze(-1).expand(4, 5)
    assert torch.equal(zero_outside(broadcast, keep), _where(broadcast, keep))
    columns = x.detach().t()
    assert torch.equal(zero_outside(columns, keep.t()), _where(columns, keep.t()))


def test_integer_tensors_fall_back_to_where() -> None:
    x = torch.tensor([3, -4, 5])
    keep = torch.tensor([True, False, True])
    assert tolist_1d(zero_outside(x, keep)) == [3, 0, 5]
