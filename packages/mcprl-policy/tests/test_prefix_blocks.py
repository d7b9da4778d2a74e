"""Block hashes chained through a sequence, and common prefix lengths."""

from __future__ import annotations

from mcprl_policy.prefix_blocks import block_hashes, common_length


def test_block_hashes_are_chained_and_only_cover_whole_blocks_up_to_the_limit() -> None:
    a = block_hashes([1, 2, 3, 4, 5], limit=5, block=2)
    assert len(a) == 2  # [1, 2], [1, 2, 3, 4]: the lone 5 is no whole block
    assert block_hashes([1, 2, 3, 4, 5], limit=3, block=2) == a[:1]
    b = block_hashes([9, 9, 3, 4], limit=4, block=2)
    assert b[1] != a[1]  # the same second block after a different first one


def test_common_length_counts_the_agreeing_ids() -> None:
    assert common_length([1, 2, 3], [1, 2, 4]) == 2
    assert common_length([1, 2], [1, 2, 3]) == 2
    assert common_length([1, 2, 3], [1, 2, 3], start=1) == 3
