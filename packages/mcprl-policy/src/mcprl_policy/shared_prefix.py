"""One prefill for the prefix that distinct prompts admitted together share: the system prompt and tool schemas
of different tasks on the same servers.

First turns of tasks whose tools come from the same servers render the same system prompt and tool schemas
(hundreds of tokens) and differ only in the task's question. With full attention the keys and values of a
causal model's first ``n`` positions are the cache of those ``n`` tokens whatever follows, so the decode engine
prefills such a prefix once (`prefill_prefixes`) and every prompt sharing it prefills only its own rest after a
copy of it, as after a prefix-cache hit. `shared_prefixes` finds the prefixes through block hashes
(`mcprl_policy.prefix_blocks`): cheap for a whole admission, and only prefixes of at least a block are worth a
prefill of their own. Linear-attention (recurrent) states hold only after a whole sequence: never for them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import DynamicCache

from mcprl_policy.cache_rows import row_state
from mcprl_policy.prefill_batch import whole_prompts
from mcprl_policy.prefix_blocks import BLOCK_TOKENS, block_hashes, common_length
from mcprl_policy.prefix_cache import CachedPrefix

if TYPE_CHECKING:
    from mcprl_policy.decode import DecodeRequest

__all__ = ["group_by_shared_prefix", "prefill_prefixes", "shared_prefixes"]


def shared_prefixes(prompts: Sequence[Sequence[int]], *, block: int = BLOCK_TOKENS) -> list[int]:
    """For each prompt, the length of the prefix it shares with the other prompts that share its longest shared
    block-aligned prefix (0 when it shares no whole block with any): at least one token of every prompt is left
    after it.

    Prompts grouped by their deepest block shared with another prompt get one common length: their longest common
    prefix, capped so that each keeps a token to feed. A prompt alone in its group (the others that share its
    blocks share more among themselves) gets 0.
    """
    hashes = [block_hashes(p, limit=len(p) - 1, block=block) for p in prompts]
    counts = Counter(h for chain in hashes for h in chain)
    groups: dict[int, list[int]] = {}
    for i, chain in enumerate(hashes):
        deepest = next((h for h in reversed(chain) if counts[h] > 1), None)
        if deepest is not None:
            groups.setdefault(deepest, []).append(i)
    lengths = [0] * len(prompts)
    for members in groups.values():
        if (
            len(members) < 2
        ):  # its shared blocks are shared deeper by others: prefilling them alone saves nothing
            continue
        first = prompts[members[0]]
        n = min(len(prompts[i]) - 1 for i in members)
        for i in members[1:]:
            n = common_length(first[:n], prompts[i])
        if n >= block and all(list(prompts[i][:n]) == list(first[:n]) for i in members):
            for i in members:
                lengths[i] = n
    return lengths


def group_by_shared_prefix(
    requests: Sequence[DecodeRequest], *, block: int = BLOCK_TOKENS
) -> dict[tuple[int, ...], list[DecodeRequest]]:
    """The requests whose prompts share a prefix of at least ``block`` tokens (`shared_prefixes`), by prefix."""
    groups: dict[tuple[int, ...], list[DecodeRequest]] = {}
    lengths = shared_prefixes([r.prompt_ids for r in requests], block=block)
    for request, n in zip(requests, lengths, strict=True):
        if n:
            groups.setdefault(tuple(request.prompt_ids[:n]), []).append(request)
    return groups


def prefill_prefixes(
    forward: Callable[..., Any],
    model: nn.Module,
    prefixes: Sequence[Sequence[int]],
    *,
    pad_token_id: int,
    device: torch.device,
) -> list[CachedPrefix]:
    """The cache state of each of ``prefixes``, prefilled as one left-padded batch through ``forward`` (the
    engine's prefill forward of ``model``, which must be full attention throughout)."""
    batch = whole_prompts(prefixes, pad_token_id=pad_token_id, device=device)
    out = forward(
        input_ids=batch.ids,
        attention_mask=batch.mask,
        position_ids=batch.positions,
        past_key_values=DynamicCache(config=getattr(model, "config", None)),
    )
    width = int(batch.ids.shape[1])
    return [
        CachedPrefix(
            layers=row_state(out.past_key_values, i, torch.arange(width - len(ids), width, device=device)),
            length=len(ids),
        )
        for i, ids in enumerate(prefixes)
    ]
