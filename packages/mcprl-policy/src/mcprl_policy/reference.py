"""The reference policy for the KL term: LoRA → the same model with adapters off; full FT → a frozen copy.

For a full fine-tune the copy can follow the policy as an exponential moving average (``update(ema=β)``:
``ref ← β·ref + (1-β)·policy``) or be re-synced periodically (``sync()``). Only floating-point tensors are
averaged or copied; integer buffers (e.g. quantisation state) are left alone. A copy that moved away from the
weights it was made from is checkpointed with `state_dict` and restored with `load_state_dict`, so a resumed run
continues with the same reference.

The copy is stored in the policy's compute dtype (`mcprl_policy.Precision.dtype`): under ``bf16-mixed`` the
policy's float32 master weights are the trained ones, the frozen reference needs no more than bf16. Every
reference forward runs under the policy's `Policy.autocast`, as the policy's own do, in the training forward's
layout (``packed``, ``padded`` or ``prefix_grouped``: a group's shared prefix once), and scores only the tokens
the caller reads (``needed``: the KL term reads the sampled ones).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import assert_never

import torch
from torch import nn

from mcprl_policy.attention import is_packable
from mcprl_policy.errors import PolicyError
from mcprl_policy.loading import torch_dtype
from mcprl_policy.packed import PackedForward, packed_forward
from mcprl_policy.padded import Layout, padded_forward
from mcprl_policy.policy import Policy
from mcprl_policy.prefix_grouped import prefix_grouped_forward

__all__ = ["ReferencePolicy", "frozen_forward"]


def frozen_forward(
    policy: Policy,
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    temperature: float,
    *,
    layout: Layout = "packed",
    needed: torch.Tensor | None = None,
) -> PackedForward:
    """Per-token logprobs of ``sequences`` under a frozen ``model`` read as ``policy`` reads its own.

    Runs under the policy's `Policy.autocast`, with its logits chunking, vocabulary limit and pad token, in
    ``layout``: ``packed`` falls back to padded rows where the model cannot pack (`is_packable`); every layout
    gives the same per-token results. ``needed`` (``(N,)`` bool) scores only those tokens (`scored_tokens`; the
    others read 0). No autograd context is set: callers run it under ``torch.no_grad()``.
    """
    chunk, limit = policy.logits_chunk_size, policy.vocab_limit
    pad = int(policy.tokenizer.pad_token_id or 0)
    with policy.autocast():
        match layout:
            case "packed" if is_packable(model):
                return packed_forward(
                    model,
                    sequences,
                    temperature=temperature,
                    chunk_size=chunk,
                    vocab_limit=limit,
                    needed=needed,
                )
            case "packed" | "padded" | "prefix_grouped":
                forward = prefix_grouped_forward if layout == "prefix_grouped" else padded_forward
                return forward(
                    model,
                    sequences,
                    temperature=temperature,
                    chunk_size=chunk,
                    pad_token_id=pad,
                    vocab_limit=limit,
                    needed=needed,
                )
            case _:
                assert_never(layout)


class ReferencePolicy:
    """Reference log-probabilities for the KL penalty; build with `ReferencePolicy.for_policy`."""

    def __init__(self, policy: Policy, frozen: nn.Module | None, *, layout: Layout = "packed") -> None:
        self.policy = policy
        self.frozen = frozen
        self.layout: Layout = layout

    @classmethod
    def for_policy(cls, policy: Policy, *, layout: Layout = "packed") -> ReferencePolicy:
        """Adapters-off view of a LoRA policy (no copy), or a frozen deep copy (in the compute dtype) of a
        fully trained one; its forwards run in ``layout`` (the training forward's)."""
        if policy.lora is not None:
            if not hasattr(policy.model, "disable_adapter"):
                raise PolicyError("a LoRA policy's model must be a peft model with disable_adapter()")
            return cls(policy, None, layout=layout)
        frozen = copy.deepcopy(policy.model).to(torch_dtype(policy.precision.dtype))
        frozen.eval()
        for p in frozen.parameters():
            p.requires_grad_(False)
        return cls(policy, frozen, layout=layout)

    @property
    def shares_weights(self) -> bool:
        """Whether the reference is the policy's own base weights (LoRA) rather than a copy."""
        return self.frozen is None

    @torch.no_grad()
    def logprobs(
        self,
        sequences: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        needed: torch.Tensor | None = None,
    ) -> PackedForward:
        """Per-token reference logprobs and entropies of packed ``sequences`` (no values, no autograd); with
        ``needed`` (``(N,)`` bool) only those tokens are scored, the others read 0."""
        forward = functools.partial(frozen_forward, layout=self.layout, needed=needed)
        if self.frozen is not None:
            return forward(self.policy, self.frozen, sequences, temperature)
        model = self.policy.model
        was_training = model.training
        model.eval()
        try:
            with model.disable_adapter():  # pyright: ignore[reportCallIssue, reportAttributeAccessIssue]
                return forward(self.policy, model, sequences, temperature)
        finally:
            model.train(was_training)

    @torch.no_grad()
    def update(self, *, ema: float) -> None:
        """``ref ← ema·ref + (1-ema)·policy`` over floating-point tensors (full fine-tune only)."""
        if not 0.0 <= ema <= 1.0:
            raise ValueError(f"ema must be in [0, 1], got {ema}")
        frozen = self._require_copy("update")
        source = self.policy.model.state_dict()
        done: set[int] = set()
        for name, target in frozen.state_dict().items():
            # Tied weights (embeddings / lm_head) appear under two names: blend the storage once.
            if target.is_floating_point() and target.data_ptr() not in done:
                done.add(target.data_ptr())
                target.mul_(ema).add_(source[name].to(target.dtype), alpha=1.0 - ema)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The copy's tensors, detached clones on the CPU (full fine-tune only)."""
        frozen = self._require_copy("state_dict")
        return {name: t.detach().to("cpu", copy=True) for name, t in frozen.state_dict().items()}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what `state_dict` returned (full fine-tune only).

        Raises:
            PolicyError: a LoRA reference, or tensors that do not match the copy's names and shapes.
        """
        frozen = self._require_copy("load_state_dict")
        own = frozen.state_dict()
        if own.keys() != state.keys():
            missing, extra = sorted(own.keys() - state.keys()), sorted(state.keys() - own.keys())
            raise PolicyError(
                f"reference state does not match the model: missing {missing[:5]}, unexpected {extra[:5]}"
            )
        for name, target in own.items():
            if target.shape != state[name].shape:
                raise PolicyError(
                    f"reference state {name!r}: shape {tuple(state[name].shape)}, the model has "
                    f"{tuple(target.shape)}"
                )
            target.copy_(state[name])

    def sync(self) -> None:
        """Copy the policy's current floating-point weights into the reference (full fine-tune only)."""
        self.update(ema=0.0)

    def _require_copy(self, what: str) -> nn.Module:
        if self.frozen is None:
            raise PolicyError(
                f"{what}() needs a full fine-tune reference; a LoRA reference is the base model"
            )
        return self.frozen
