"""The samplers' own copy of the trained weights (``collection.overlap``): generation beside an update.

Under overlap (`mcprl_train.loop.overlap`) the update of step k changes the trained policy's weights in a worker
thread while the samplers generate step k+1. They must not read those weights mid-update: they generate from a
`SamplingSnapshot` instead, which changes only when the trainer syncs the samplers at a step boundary. Without
overlap no snapshot exists and the samplers read the trained policy (`UpdateBackend.sampling_policy`).
"""

from __future__ import annotations

import copy

import torch

from mcprl_policy import Policy

__all__ = ["SamplingSnapshot"]


class SamplingSnapshot:
    """The samplers' own copy of a policy's trainable weights, so an update can run while they generate.

    Frozen parameters (a LoRA base, 4-bit weights) are shared with the trained policy, not copied: no update
    writes them. Buffers and trainable parameters are copied once here and then on every `refresh`.

    Args:
        source: The trained policy's sampling side (`UpdateBackend.sampling_policy`).
    """

    def __init__(self, source: Policy) -> None:
        self.source = source
        shared: dict[int, object] = {id(p): p for p in source.model.parameters() if not p.requires_grad}
        self.policy = copy.copy(source)  # tokenizer, settings: the source's own
        self.policy.model = copy.deepcopy(source.model, memo=shared)
        self.policy.value_head = None  # the samplers read no values

    def refresh(self) -> None:
        """Copy the source's current trainable parameters and buffers into the snapshot (in place).

        The in-place copies bump the snapshot tensors' version counters, so the samplers' weight fingerprints
        (the HF prefix cache, the vLLM engine's lazy sync) see new weights.
        """
        with torch.no_grad():
            mine = dict(self.policy.model.named_parameters())
            for name, p in self.source.model.named_parameters():
                if p.requires_grad:
                    mine[name].copy_(p)
            theirs = dict(self.source.model.named_buffers())
            for name, b in self.policy.model.named_buffers():
                b.copy_(theirs[name])
