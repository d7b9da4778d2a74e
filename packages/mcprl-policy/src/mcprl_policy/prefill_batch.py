"""The decode engine's prefill batches: token ids, attention mask and positions of each row, and its prompt's ids.

Every row's last prompt token sits in the last column, so one ``logits_to_keep=1`` forward gives each row's
next-token logits. Rows are built in Python and copied to the device once (one host-to-device transfer per
tensor and prefill).

- `whole_prompts`: ``[pad | prompt]``, positions from 0 at the first prompt token.
- `after_prefixes`: prompts that resume a cached prefix feed only their tails; the mask also covers the cached
  columns, ``[pad | cached prefix | pad | tail]`` with both parts left-padded (to the longest prefix and the
  longest tail), and positions continue each row's prefix.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import torch

__all__ = ["PrefillBatch", "after_prefixes", "prompt_token_mask", "whole_prompts"]


@attrs.frozen(kw_only=True, eq=False)
class PrefillBatch:
    """One prefill forward's inputs.

    Attributes:
        ids: ``(n, W)`` token ids fed (pads where a row is shorter).
        mask: ``(n, C + W)`` attention mask over the ``C`` cached columns (0 without a cache) and the fed ones.
        positions: ``(n, W)`` position of each fed token (0 on pads).
    """

    ids: torch.Tensor
    mask: torch.Tensor
    positions: torch.Tensor


def whole_prompts(
    prompts: Sequence[Sequence[int]], *, pad_token_id: int, device: torch.device
) -> PrefillBatch:
    """Whole ``prompts`` left-padded to the longest."""
    width = max(len(p) for p in prompts)
    pads = [width - len(p) for p in prompts]
    ids = torch.tensor(
        [[pad_token_id] * k + list(p) for k, p in zip(pads, prompts, strict=True)],
        dtype=torch.long,
        device=device,
    )
    mask = torch.tensor([[0] * k + [1] * (width - k) for k in pads], dtype=torch.long, device=device)
    return PrefillBatch(ids=ids, mask=mask, positions=(mask.cumsum(-1) - 1).clamp(min=0))


def after_prefixes(
    prompts: Sequence[Sequence[int]], prefixes: Sequence[int], *, pad_token_id: int, device: torch.device
) -> PrefillBatch:
    """What follows each prompt's cached prefix of ``prefixes[i]`` tokens (each shorter than its prompt)."""
    cached = max(prefixes)
    tails = [list(p[n:]) for p, n in zip(prompts, prefixes, strict=True)]
    width = max(len(t) for t in tails)
    ids: list[list[int]] = []
    mask: list[list[int]] = []
    positions: list[list[int]] = []
    for n, tail in zip(prefixes, tails, strict=True):
        pad = width - len(tail)
        ids.append([pad_token_id] * pad + tail)
        mask.append([0] * (cached - n) + [1] * n + [0] * pad + [1] * len(tail))
        positions.append([0] * pad + list(range(n, n + len(tail))))
    return PrefillBatch(
        ids=torch.tensor(ids, dtype=torch.long, device=device),
        mask=torch.tensor(mask, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
    )


def prompt_token_mask(prompts: Sequence[Sequence[int]], *, vocab: int, device: torch.device) -> torch.Tensor:
    """``(n, vocab)`` True at each id present in the row's prompt (what a repetition penalty applies to)."""
    width = max(len(p) for p in prompts)
    # Short rows are padded with their own last id: marking it twice marks nothing new (a pad id would).
    ids = torch.tensor([[*p, *[p[-1]] * (width - len(p))] for p in prompts], dtype=torch.long, device=device)
    return torch.zeros(len(prompts), vocab, dtype=torch.bool, device=device).scatter_(1, ids, True)
