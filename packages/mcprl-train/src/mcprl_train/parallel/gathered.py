"""ZeRO-3's full weights outside the update: gathered for the samplers, released before the engine computes.

Two ways. The HF sampler reads the module's parameters in every decoding step, so `GatheredWeights` holds all
of them full between updates. A vLLM engine holds its own copy and reads the module's weights only when they are
pushed into it: `ZeroParameters` is the push's `mcprl_policy.weight_push.ParameterGather`, all-gathering one
bucket of parameters at a time (``deepspeed.zero.GatheredParameters`` over the bucket, as TRL does per
parameter), so nothing is full between pushes.

Under ZeRO-3 each rank holds ``1/N`` of every parameter; the engine all-gathers a submodule's parameters in a
forward pre-hook and partitions them again in its post-hook. `GatheredWeights` holds every parameter of the
engine's module at full size (``deepspeed.zero.GatheredParameters`` over all of them, ``modifier_rank=None``)
for as long as the samplers read them, as TRL's ``unwrap_model_for_generation`` with
``gather_deepspeed3_params=True`` does (trl/models/utils.py): while the weights are full the engine's ZeRO-3
module hooks are removed — each post-hook would otherwise partition a submodule's parameters again after the
sampler's call — and they are registered again before the weights are released.

Gathering is collective (every rank calls `GatheredWeights.gather` at the same point); releasing is local (each
rank drops its full copies and keeps its partition), so any engine call can release first.

The alternative, gathering per layer inside each sampler forward (the hooks left on, TRL's
``gather_deepspeed3_params=False``), peaks at one layer plus the prefetch bucket instead of the full weights,
but every decoding step then is a collective: all ranks must run the same forwards in the same order. TRL keeps
them in step with ``generate(synced_gpus=True)``; here each rank runs its own multi-turn episodes, whose
lengths and tool latencies differ, so the ranks' forwards cannot be matched without padding every rank's
decoding to the slowest one's. Not built.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack
from typing import Any

from torch import nn

from mcprl_train.parallel.deepspeed import require_deepspeed

__all__ = ["GatheredWeights", "ZeroParameters"]


class ZeroParameters:
    """A vLLM push's gather under ZeRO-3: each bucket all-gathered (collective), released after it is read.

    ``gathered`` calls ``GatheredParameters`` with ``modifier_rank=None``: nothing written to a gathered
    parameter is kept, and re-partitioning is local.
    """

    @property
    def collective(self) -> bool:
        return True

    def full_numel(self, param: nn.Parameter) -> int:
        numel = getattr(param, "ds_numel", None)
        return int(numel) if numel is not None else param.numel()

    def gathered(self, params: Sequence[nn.Parameter]) -> AbstractContextManager[object]:
        deepspeed = require_deepspeed()
        context: AbstractContextManager[object] = deepspeed.zero.GatheredParameters(
            list(params), modifier_rank=None
        )
        return context


class GatheredWeights:
    """The full parameters of a ZeRO-3 engine's module between updates (see the module docstring).

    Args:
        engine: A ``deepspeed.DeepSpeedEngine`` at ZeRO stage 3 with an optimizer (its ``parameter_offload``
            owns the module hooks).
    """

    def __init__(self, engine: Any) -> None:
        self._offload = engine.optimizer.parameter_offload
        self._module: nn.Module = engine.module
        self._stack: ExitStack | None = None

    @property
    def full(self) -> bool:
        """Whether the parameters are gathered now."""
        return self._stack is not None

    def gather(self) -> None:
        """All-gather every parameter to full size and take the ZeRO-3 hooks off (collective; idempotent)."""
        if self._stack is not None:
            return
        deepspeed = require_deepspeed()
        stack = ExitStack()
        stack.enter_context(
            deepspeed.zero.GatheredParameters(list(self._module.parameters()), modifier_rank=None)
        )
        for param in self._module.parameters():
            param.ds_active_sub_modules.clear()  # pyright: ignore[reportAttributeAccessIssue, reportUnknownMemberType]
        for hook in [*self._offload.forward_hooks, *self._offload.backward_hooks]:
            hook.remove()
        self._offload.forward_hooks = []
        self._offload.backward_hooks = []
        self._stack = stack

    def release(self) -> None:
        """Put the ZeRO-3 hooks back and drop the full copies, keeping this rank's partition (local)."""
        if self._stack is None:
            return
        self._offload._register_deepspeed_module(self._offload.module)
        stack, self._stack = self._stack, None
        stack.close()
