"""Token ids hashed in fixed blocks: how prompts that share a long prefix find each other cheaply.

Prompts of tasks that use the same tool servers start with the same system prompt and tool schemas (hundreds of
tokens) and differ only in their last message. As in vLLM's automatic prefix caching (Kwon et al. 2023,
"Efficient Memory Management for Large Language Model Serving with PagedAttention", §4.4), a sequence is cut
into blocks of `BLOCK_TOKENS` ids and block ``k`` is keyed by a hash chained through blocks ``0..k``: two
sequences share their first ``k`` blocks exactly when (hash collisions aside, which callers rule out by
comparing the ids) their ``k``-th chain hashes are equal. Finding the longest shared block-aligned prefix
among many sequences is then a walk over one sequence's blocks with a dictionary look-up per block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

__all__ = ["BLOCK_TOKENS", "block_hashes", "common_length"]

BLOCK_TOKENS: Final = 32


def block_hashes(ids: Sequence[int], *, limit: int, block: int = BLOCK_TOKENS) -> list[int]:
    """Chain hashes of the full blocks of ``ids`` that end at or before ``limit``: item ``k`` keys ``ids[:(k + 1)
    * block]``."""
    hashes: list[int] = []
    chain = 0
    for end in range(block, min(limit, len(ids)) + 1, block):
        chain = hash((chain, tuple(ids[end - block : end])))
        hashes.append(chain)
    return hashes


def common_length(a: Sequence[int], b: Sequence[int], *, start: int = 0) -> int:
    """The length of the longest common prefix of ``a`` and ``b``, given that their first ``start`` ids agree."""
    n = start
    stop = min(len(a), len(b))
    while n < stop and a[n] == b[n]:
        n += 1
    return n
