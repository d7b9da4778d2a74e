"""Where the learner's update runs: the `UpdateBackend` seam (with the `KLReference` it may partition) and
its one-process implementation.

The learner (`mcprl_train.loop.learner`) owns what an update computes; a backend owns where the trained model
lives, how an optimizer step happens there, which weights the samplers read and what a checkpoint holds beyond
the policy's files. `TorchBackend` is this process (CPU, one GPU, MPS); `mcprl_train.parallel.ds_backend` is
DeepSpeed. Reductions over ranks go through `mcprl_train.collectives` (the identity in one process).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog
import torch

from mcprl_policy import Layout, PackedForward, Policy, policy_forward
from mcprl_policy.compiled import CompiledLayers
from mcprl_train.config import OptimConfig
from mcprl_train.errors import RatioHealthError
from mcprl_train.loop.samples import Sample
from mcprl_train.typed_torch import optimizer_step

if TYPE_CHECKING:
    from mcprl_policy.weight_push import ParameterGather

__all__ = ["CheckpointWriter", "KLReference", "TorchBackend", "UpdateBackend", "adamw"]

logger = structlog.get_logger()

CheckpointWriter = Callable[[Path], None]
"""Writes one part of a checkpoint into the directory it is given (see `mcprl_train.run.checkpoint`)."""


class KLReference(Protocol):
    """The KL reference the learner reads and moves: `mcprl_policy.ReferencePolicy` (one process, ZeRO 0-2) or
    a ZeRO-3 partitioned one (`mcprl_train.parallel.ds_reference`), where `logprobs` is collective."""

    @property
    def shares_weights(self) -> bool:
        """Whether the reference is the policy's own base weights (LoRA): nothing to move or checkpoint."""
        ...

    def logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        """Per-token reference logprobs of packed ``sequences`` (no autograd); ``needed`` marks the tokens the
        caller reads (a reference may score more of them, never fewer)."""
        ...

    def update(self, *, ema: float) -> None:
        """``ref ← ema·ref + (1-ema)·policy``."""
        ...

    def sync(self) -> None:
        """Copy the policy's weights into the reference."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """What the learner's checkpointed state holds of the reference."""
        ...

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None: ...


class UpdateBackend(Protocol):
    """The model as the learner trains it (see the module docstring). Engine-touching methods are collective."""

    @property
    def policy(self) -> Policy:
        """The trained policy."""
        ...

    @property
    def optimizer(self) -> torch.optim.Optimizer:
        """The torch optimizer whose learning rate the learner's scheduler drives."""
        ...

    @property
    def sampling_policy(self) -> Policy:
        """The policy the samplers generate from and a checkpoint saves as ``policy/``."""
        ...

    def forward(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float,
        values: bool,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        """Per-token logprobs, entropies (and values) of ``sequences``, concatenated `(N,)`.

        ``needed`` marks the tokens the caller reads (`mcprl_policy.packed.scored_tokens`); a backend may
        score more of them, never fewer.
        """
        ...

    def lay_out(self, batches: list[list[Sample]]) -> tuple[list[list[Sample]], int]:
        """The micro-batches to run and how many filler sequences (empty action mask) were added."""
        ...

    def zero_grad(self) -> None: ...

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradient of one micro-batch's loss, already normalised over every rank's tokens."""
        ...

    def step(self) -> float:
        """Clip at ``optim.max_grad_norm`` and step; returns the pre-clip gradient norm."""
        ...

    def publish(self) -> None:
        """Make the trained weights visible to `sampling_policy`."""
        ...

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state kept in the checkpoint's learner state (empty when `save_partitions` holds it)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...

    def save_partitions(self, root: Path) -> dict[str, CheckpointWriter]:
        """Write this rank's partitions under ``root``; returns the checkpoint parts rank 0 moves in."""
        ...

    def load_partitions(self, checkpoint: Path) -> None:
        """Restore what `save_partitions` wrote into the checkpoint at ``checkpoint``."""
        ...

    def checkpoint_meta(self) -> dict[str, Any]:
        """Facts a checkpoint records about the layout it was saved from (world size, ZeRO stage)."""
        ...

    def partitioned_reference(self) -> KLReference | None:
        """A KL reference partitioned like the parameters (ZeRO-3); None: a full copy of `sampling_policy`."""
        ...

    def weight_gather(self) -> ParameterGather | None:
        """How a vLLM push gathers partitioned parameters, one bucket at a time; None: they are full."""
        ...


def adamw(params: Iterable[torch.nn.Parameter], optim: OptimConfig) -> torch.optim.AdamW:
    """The AdamW of ``optim`` over ``params``.

    Raises:
        RatioHealthError: no parameter requires a gradient (nothing could ever be learned).
    """
    params = list(params)
    if not params:
        raise RatioHealthError("the policy has no trainable parameter (requires_grad is False everywhere)")
    return torch.optim.AdamW(
        params, lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=optim.weight_decay
    )


class TorchBackend:
    """The update in this process: autograd, gradient clipping and a torch AdamW on the policy itself.

    Args:
        policy: The trained policy; the samplers read its live weights.
        optim: Optimizer, clipping, forward layout and compile settings.

    Raises:
        MissingExtraError: ``optim.compile`` where inductor cannot compile (no C++ compiler, no triton).
        TypeError: ``optim.compile`` for a model without a ``layers`` list of decoder layers.
    """

    def __init__(self, policy: Policy, optim: OptimConfig) -> None:
        self.policy = policy
        self.sampling_policy = policy
        self.params = list(policy.trainable_parameters())
        self.optimizer = adamw(self.params, optim)
        self.max_grad_norm = optim.max_grad_norm
        self.layout: Layout = optim.layout
        self._compiled = CompiledLayers(policy.model) if optim.compile else None

    def forward(
        self,
        sequences: Sequence[Sequence[int]],
        *,
        temperature: float,
        values: bool,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        with self.policy.autocast(), self._compiled.active() if self._compiled else nullcontext():
            return policy_forward(
                self.policy,
                sequences,
                temperature=temperature,
                values=values,
                layout=self.layout,
                needed=needed,
            )

    def lay_out(self, batches: list[list[Sample]]) -> tuple[list[list[Sample]], int]:
        return batches, 0

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def backward(self, loss: torch.Tensor) -> None:
        torch.autograd.backward(loss)

    def step(self) -> float:
        """Clip, step; returns the pre-clip gradient norm. A step with no gradient anywhere is an error.

        A non-finite norm skips the step (the gradients are dropped) and is returned for the metrics.
        """
        if all(p.grad is None for p in self.params):
            raise RatioHealthError(
                "no trainable parameter received gradient in this minibatch: the loss does not depend on the "
                "trainable parameters (detached forward, frozen model, or an empty action mask)"
            )
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm))
        if not math.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            logger.warning("non_finite_gradient_skipped", grad_norm=norm)
            return norm
        optimizer_step(self.optimizer)
        return norm

    def publish(self) -> None:
        """Nothing to do: the samplers read the trained weights."""

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])

    def save_partitions(self, root: Path) -> dict[str, CheckpointWriter]:
        """Nothing beyond the policy's files."""
        del root
        return {}

    def load_partitions(self, checkpoint: Path) -> None:
        del checkpoint

    def checkpoint_meta(self) -> dict[str, Any]:
        return {}

    def partitioned_reference(self) -> None:
        """None: the parameters are full."""

    def weight_gather(self) -> None:
        """None: the parameters are full."""
