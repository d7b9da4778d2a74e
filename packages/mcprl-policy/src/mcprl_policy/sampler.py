"""The samplers' common API: mcprl-env's ``Sampler`` protocol plus weight sync and metrics."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from mcprl_policy.completion import Completion

__all__ = ["PolicySampler"]


@runtime_checkable
class PolicySampler(Protocol):
    """What the trainer needs from a sampler (`HFSampler`, `VLLMSampler`): type samplers with this, not getattr."""

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Completion:
        """Generate one continuation of ``prompt_ids``; with ``seed``, a function of prompt, seed and weights."""
        ...

    def sync_weights(self) -> bool:
        """Make generation use the policy's current weights (called after each optimizer update).

        Returns:
            Whether weights were pushed to the generation engine (False for a sampler reading the live weights,
            or when the engine already held them).
        """
        ...

    def metrics(self) -> dict[str, float]:
        """Sampler counters, namespaced ``sampler/...``."""
        ...
