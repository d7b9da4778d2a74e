"""One prefill for the identical prompts of one admission: the G episodes of a GRPO group.

The G episodes of a group start from the same task prompt, and episodes that sampled the same turn and got the
same tool result send the same next prompt. `SharedPrompts` groups the requests the decode engine admits
together by their token ids; the engine prefills each distinct prompt once (its first request, the group's
leader) and `fan_out` gives every request of the group its own copy of the leader's prefilled state: cache rows
(attention keys and values, or a linear-attention layer's conv and recurrent state), attention mask, last
position's logits and repetition-penalty ``seen`` row. Each request then draws its first token from those logits
with its own generator and decodes, finishes and leaves on its own, exactly as if it had been prefilled alone.

The copies are made when the rows are admitted rather than shared copy-on-write as in vLLM's prefix caching
(Kwon et al. 2023, "Efficient Memory Management for Large Language Model Serving with PagedAttention", §4.4):
a running row owns its slot of the KV pool or its row of the concatenated cache, and the decode step writes
every row's next column in place, so a shared block would be copied on the first step anyway.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs
import torch
from transformers import DynamicCache

from mcprl_policy.cache_rows import select_rows

if TYPE_CHECKING:
    from mcprl_policy.decode import DecodeRequest

__all__ = ["Prefilled", "SharedPrompts", "fan_out"]


class SharedPrompts:
    """The requests of one admission grouped by identical ``prompt_ids``, in admission order.

    Args:
        requests: the requests admitted together.
    """

    def __init__(self, requests: Sequence[DecodeRequest]) -> None:
        self._order = {id(r): i for i, r in enumerate(requests)}
        self._members: dict[tuple[int, ...], list[DecodeRequest]] = {}
        for request in requests:
            self._members.setdefault(tuple(request.prompt_ids), []).append(request)

    @property
    def leaders(self) -> list[DecodeRequest]:
        """The first request of each distinct prompt, in admission order: the ones to prefill."""
        return [members[0] for members in self._members.values()]

    def rows(self, leaders: Sequence[DecodeRequest]) -> tuple[list[DecodeRequest], list[int]]:
        """Every request sharing a prompt with one of ``leaders`` (in admission order), and for each the index of
        its leader in ``leaders``.

        Raises:
            ValueError: a request in ``leaders`` that is not a leader of this admission.
        """
        position: dict[tuple[int, ...], int] = {}
        for i, leader in enumerate(leaders):
            key = tuple(leader.prompt_ids)
            members = self._members.get(key)
            if not members or members[0] is not leader:
                raise ValueError("fan-out asked for a request that leads no prompt of this admission")
            position[key] = i
        rows = sorted((r for key in position for r in self._members[key]), key=lambda r: self._order[id(r)])
        return rows, [position[tuple(r.prompt_ids)] for r in rows]


@attrs.frozen(kw_only=True, eq=False)
class Prefilled:
    """The state of prefilled rows before their first token is drawn.

    Attributes:
        cache: the rows' cache (attention layers ``(n, kv_heads, W, head_dim)``, recurrent layers per row).
        mask: ``(n, W)`` attention mask (1 on prompt tokens).
        logits: ``(n, V)`` the last position's logits.
        seen: ``(n, V)`` ids each row's repetition penalty applies to, or None without a penalty.
    """

    cache: DynamicCache
    mask: torch.Tensor
    logits: torch.Tensor
    seen: torch.Tensor | None


def fan_out(prefilled: Prefilled, index: Sequence[int]) -> Prefilled:
    """Row ``i`` of the result is a copy of row ``index[i]`` of ``prefilled`` (the cache is rebuilt in place).

    Every row of the result owns its tensors: attention keys and values, recurrent states, mask, logits and
    ``seen`` are gathered (copied), so decoding one row never writes into another. ``index`` equal to
    ``range(n)`` returns ``prefilled`` untouched.
    """
    n = int(prefilled.mask.shape[0])
    if list(index) == list(range(n)):
        return prefilled
    copies = torch.tensor(index, dtype=torch.long, device=prefilled.mask.device)
    select_rows(prefilled.cache, copies, first_column=0)
    return Prefilled(
        cache=prefilled.cache,
        mask=prefilled.mask[copies],
        logits=prefilled.logits[copies],
        seen=None if prefilled.seen is None else prefilled.seen[copies],
    )
