"""The prefill batches' layout, written out by hand for small rows."""

from __future__ import annotations

import torch

from mcprl_policy.prefill_batch import after_prefixes, prompt_token_mask, whole_prompts

CPU = torch.device("cpu")


def test_whole_prompts_are_left_padded_with_positions_from_their_first_token() -> None:
    batch = whole_prompts([[5, 6, 7], [8]], pad_token_id=0, device=CPU)
    assert batch.ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert batch.mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.positions.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_tails_after_cached_prefixes_end_in_the_last_column_and_continue_their_positions() -> None:
    batch = after_prefixes([[1, 2, 3, 4, 5], [1, 2, 9]], [2, 1], pad_token_id=0, device=CPU)
    assert batch.ids.tolist() == [[3, 4, 5], [0, 2, 9]]
    # [pad | cached prefix | pad | tail]: two cached columns (the longer prefix), then three fed ones.
    assert batch.mask.tolist() == [[1, 1, 1, 1, 1], [0, 1, 0, 1, 1]]
    assert batch.positions.tolist() == [[2, 3, 4], [0, 1, 2]]


def test_the_prompt_token_mask_holds_each_rows_own_ids_and_never_a_pad() -> None:
    mask = prompt_token_mask([[3, 1, 3], [2]], vocab=5, device=CPU)
    assert mask.tolist() == [[False, True, False, True, False], [False, False, True, False, False]]
