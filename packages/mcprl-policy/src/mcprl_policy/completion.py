"""What a sampler returns for one request (satisfies mcprl-env's ``Completion`` protocol structurally)."""

from __future__ import annotations

from typing import Literal

import attrs

__all__ = ["Completion", "FinishReason"]

FinishReason = Literal["stop", "length"]


@attrs.frozen(kw_only=True)
class Completion:
    """One generated assistant turn.

    Attributes:
        token_ids: exactly the sampled ids, including the end-of-turn id when it was sampled.
        logprobs: sampling logprob of each id (tempered, before top-p/top-k truncation); same length.
        text: ``decode(token_ids)`` with special tokens skipped.
        finish_reason: ``"stop"`` (end-of-turn token or stop string) or ``"length"`` (max_new_tokens).
        queue_s: seconds the request waited in the sampler's queue, behind other requests, before it was
            served (an episode's wall-clock budget leaves them out); what each sampler can measure is said by
            its ``sample``.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: FinishReason
    queue_s: float = 0.0

    def __attrs_post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} logprobs")
