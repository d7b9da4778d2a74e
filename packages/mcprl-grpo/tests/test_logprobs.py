"""Chunked token log-probabilities and entropies equal the unchunked definitions."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mcprl_grpo import DTypeError, ShapeError, entropy_from_logits, token_logprobs

FAST = settings(max_examples=40, deadline=None)


@FAST
@given(
    st.integers(1, 3),
    st.integers(1, 9),
    st.integers(1, 40),
    st.sampled_from([None, 1, 2, 5, 1000]),
    st.sampled_from([0.5, 1.0, 1.7]),
    st.integers(0, 2**31 - 1),
)
def test_chunked_logprobs_and_entropy_equal_log_softmax(
    b: int, t: int, v: int, chunk: int | None, temp: float, seed: int
) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(b, t, v, generator=g, dtype=torch.float64) * 3).requires_grad_(True)
    tokens = torch.randint(0, v, (b, t), generator=g)
    lp = token_logprobs(logits, tokens, temperature=temp, chunk_size=chunk)
    ref_logp = torch.log_softmax(logits / temp, -1)
    ref = ref_logp.gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(lp, ref, atol=1e-12, rtol=1e-12)
    (g_ours,) = torch.autograd.grad(lp.sum(), logits)
    (g_ref,) = torch.autograd.grad(ref.sum(), logits)
    torch.testing.assert_close(g_ours, g_ref, atol=1e-12, rtol=1e-12)
    ent = entropy_from_logits(logits, temperature=temp, chunk_size=chunk)
    torch.testing.assert_close(ent, -(ref_logp.exp() * ref_logp).sum(-1), atol=1e-10, rtol=1e-10)
    assert bool((ent >= -1e-12).all())
    assert bool((ent <= math.log(v) + 1e-9).all())


def test_bf16_logits_are_computed_in_float32() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 5, 300, generator=g, dtype=torch.float64) * 4
    tokens = torch.randint(0, 300, (2, 5), generator=g)
    low = logits.to(torch.bfloat16)
    lp = token_logprobs(low, tokens, chunk_size=3)
    assert lp.dtype == torch.float32
    exact = torch.log_softmax(low.double(), -1).gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(lp.double(), exact, atol=1e-4, rtol=1e-4)
    assert entropy_from_logits(low).dtype == torch.float32


def test_packed_layout_and_empty_input() -> None:
    logits = torch.randn(4, 7)
    assert token_logprobs(logits, torch.tensor([0, 1, 2, 6])).shape == (4,)
    assert token_logprobs(torch.zeros(0, 7), torch.zeros(0, dtype=torch.long)).shape == (0,)
    assert entropy_from_logits(torch.zeros(2, 0, 7)).shape == (2, 0)


def test_mismatched_tokens_raise_shape_error_naming_both_shapes() -> None:
    with pytest.raises(ShapeError, match=r"tokens has shape \(2, 4\), expected \(2, 3\)"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(DTypeError, match="tokens"):
        token_logprobs(torch.zeros(2, 3, 5), torch.zeros(2, 3))
    with pytest.raises(DTypeError, match="logits"):
        token_logprobs(torch.zeros(2, 3, 5, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
