"""The prefixes that distinct prompts admitted together share, found by block hashes."""

from __future__ import annotations

from pathlib import Path

import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import DynamicCache

from mcprl_policy import Policy
from mcprl_policy.cache_rows import AttentionRow
from mcprl_policy.shared_prefix import prefill_prefixes, shared_prefixes


def test_prompts_sharing_a_system_prompt_get_its_length_and_others_get_zero() -> None:
    system = list(range(100, 140))  # 40 tokens: one whole block of 32 and 8 more
    prompts = [[*system, 1, 2], [*system, 3], [*system, 4, 5, 6], [7] * 50, [*system[:10], 8] * 5]
    assert shared_prefixes(prompts, block=32) == [40, 40, 40, 0, 0]


def test_a_prompt_keeps_a_token_to_feed() -> None:
    system = list(range(64))
    assert shared_prefixes([system, [*system, 1]], block=32) == [63, 63]
    assert shared_prefixes([system, system], block=32) == [63, 63]


def test_a_prompt_whose_shared_blocks_others_share_deeper_is_left_alone() -> None:
    a = [*range(64), 1]
    b = [*range(64), 2]
    c = [*range(32), 9, *range(40)]
    assert shared_prefixes([a, b, c], block=32) == [64, 64, 0]


@given(st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=12), max_size=8))
def test_each_shared_prefix_is_shared_block_long_and_leaves_a_token(prompts: list[list[int]]) -> None:
    lengths = shared_prefixes(prompts, block=3)
    for i, n in enumerate(lengths):
        if n:
            assert 3 <= n < len(prompts[i])
            assert sum(p[:n] == prompts[i][:n] and len(p) > n for p in prompts) >= 2


def test_prefilled_prefixes_hold_the_cache_of_each_prefix_alone(tiny_dir: Path) -> None:
    model = Policy.from_pretrained(str(tiny_dir)).model
    prefixes = [list(range(5, 45)), list(range(7, 30))]

    def forward(**kwargs: object) -> object:
        return model(use_cache=True, logits_to_keep=1, **kwargs)

    with torch.inference_mode():
        states = prefill_prefixes(forward, model, prefixes, pad_token_id=0, device=torch.device("cpu"))
        for ids, state in zip(prefixes, states, strict=True):
            assert state.length == len(ids)
            alone = model(torch.tensor([ids]), use_cache=True, past_key_values=DynamicCache()).past_key_values
            for layer, expected in zip(state.layers, alone.layers, strict=True):
                assert isinstance(layer, AttentionRow)
                torch.testing.assert_close(layer.keys, expected.keys[0], atol=1e-5, rtol=0.0)
                torch.testing.assert_close(layer.values, expected.values[0], atol=1e-5, rtol=0.0)
