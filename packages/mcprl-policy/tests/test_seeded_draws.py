"""Seeded rows are drawn in one batched exponential race: the same tokens as one ``multinomial`` per row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from mcprl_policy import SamplingParams
from mcprl_policy.decode import DecodeEngine, DecodeRequest


@pytest.fixture(scope="module")
def engine(tiny_dir: Path) -> DecodeEngine:
    model: Any = AutoModelForCausalLM.from_pretrained(tiny_dir)
    return DecodeEngine(
        model,
        params=SamplingParams(temperature=1.0, seed=3),
        stop_token_ids=frozenset({0}),
        pad_token_id=0,
        max_batch_size=64,
        decode=lambda ids: "",
    )


def _per_row_multinomial(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
    """The reference: one ``torch.multinomial`` call per row with that row's generator."""
    draws = [torch.multinomial(probs[i : i + 1], 1, generator=g) for i, g in enumerate(generators)]
    return torch.cat(draws).squeeze(-1)


def _probs(rng: torch.Generator, rows: int, vocab: int, *, top_k: int) -> torch.Tensor:
    scores = torch.randn(rows, vocab, generator=rng) * 4.0
    if top_k:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return scores.softmax(-1)


@pytest.mark.parametrize("top_k", [0, 1, 5])
def test_seeded_draws_equal_one_multinomial_per_row_step_after_step(engine: DecodeEngine, top_k: int) -> None:
    rows = [DecodeRequest(prompt_ids=[1], max_new_tokens=1, seed=1_000 + i) for i in range(37)]
    reference = [torch.Generator().manual_seed(1_000 + i) for i in range(37)]
    rng = torch.Generator().manual_seed(top_k)
    for _ in range(50):
        probs = _probs(rng, len(rows), 929, top_k=top_k)
        got = engine.chooser.draw(probs, rows)  # pyright: ignore[reportPrivateUsage]
        assert torch.equal(got, _per_row_multinomial(probs, reference))


def test_a_mixed_batch_draws_unseeded_rows_from_the_engine_generator_alike(engine: DecodeEngine) -> None:
    seeds = [7, None, 9, None]
    rows = [DecodeRequest(prompt_ids=[1], max_new_tokens=1, seed=s) for s in seeds]
    shared = torch.Generator().manual_seed(11)
    engine.chooser._generators[torch.device("cpu")] = torch.Generator().manual_seed(11)  # pyright: ignore[reportPrivateUsage]
    own = {7: torch.Generator().manual_seed(7), 9: torch.Generator().manual_seed(9)}
    probs = _probs(torch.Generator().manual_seed(0), len(rows), 50, top_k=0)
    got = engine.chooser.draw(probs, rows)  # pyright: ignore[reportPrivateUsage]
    expected = _per_row_multinomial(probs, [own[s] if s is not None else shared for s in seeds])
    assert torch.equal(got, expected)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5])
def test_a_broken_distribution_is_refused_like_multinomial_refuses_it(
    engine: DecodeEngine, bad: float
) -> None:
    rows = [
        DecodeRequest(prompt_ids=[1], max_new_tokens=1, seed=1),
        DecodeRequest(prompt_ids=[1], max_new_tokens=1, seed=2),
    ]
    probs = torch.full((2, 10), 0.1)
    probs[1, 3] = bad
    with pytest.raises(ValueError, match="`inf`, `nan` or element < 0"):
        engine.chooser.draw(probs, rows)  # pyright: ignore[reportPrivateUsage]
    with pytest.raises(RuntimeError, match="`inf`, `nan` or element < 0"):
        torch.multinomial(probs, 1)
