"""The supervised forward: the log-probability of each target token, and nothing else.

Supervised fine-tuning needs ``log p(target | prefix)`` on the target tokens only (an SFT demonstration's
assistant tokens), so unlike the RL forward (`mcprl_policy.padded.policy_forward`) this one

- projects only the target positions' hidden states through the output head (the prompt and tool results, most
  of a demonstration's tokens, never reach it),
- computes no entropy (the ``-Σ p log p`` over the vocabulary that the RL loss's entropy term needs),
- keeps the targets' logits for backward instead of recomputing them when they fit in one logits chunk
  (`Policy.logits_chunk_size` rows, the memory the policy allows at once); more targets than that go through
  chunks recomputed in backward, as the RL forward does, so a large vocabulary stays bounded.

The backbone runs in the layout the caller picks: ``packed`` (one row, varlen attention,
`mcprl_policy.packed.packed_hidden_states`), ``padded`` (`mcprl_policy.padded.padded_hidden_states`) or
``prefix_grouped`` (`mcprl_policy.prefix_grouped.prefix_grouped_sources`: a prefix that demonstrations share,
the system prompt and tool schemas of tasks on the same servers, runs once; full-attention models only).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, assert_never

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mcprl_policy.packed import backbone_and_head, pack_sequences, packed_hidden_states
from mcprl_policy.padded import padded_hidden_states
from mcprl_policy.policy import Policy
from mcprl_policy.prefix_grouped import prefix_grouped_sources

__all__ = ["SupervisedLayout", "target_logprobs", "target_token_logprobs"]

SupervisedLayout = Literal["packed", "padded", "prefix_grouped"]
"""The training layouts of the supervised forward (module docstring)."""


def target_logprobs(
    policy: Policy,
    sequences: Sequence[Sequence[int]],
    targets: Sequence[Sequence[bool]],
    *,
    layout: SupervisedLayout,
) -> torch.Tensor:
    """``log p(token i | tokens < i)`` at every target position, sequence by sequence, in position order.

    Uses the live weights (under autograd unless called inside ``torch.no_grad()``), the policy's
    `Policy.vocab_limit` and `Policy.logits_chunk_size`, temperature 1.

    Args:
        policy: the policy whose language model runs (its value head does not).
        sequences: token ids, one non-empty sequence each.
        targets: per sequence, one flag per token: True where the token is a target. The first token has no
            prefix and must not be one.
        layout: ``packed`` (one row, varlen attention), ``padded`` (right-padded rows) or ``prefix_grouped``
            (shared prefixes once).

    Returns:
        ``(M,)`` float32 logprobs, ``M`` the number of targets.

    Raises:
        ValueError: a mask whose length differs from its sequence's, or that marks a first token.
        UnpackableModelError: ``prefix_grouped`` for a model with linear-attention layers.
    """
    if len(targets) != len(sequences):
        raise ValueError(f"{len(targets)} target masks for {len(sequences)} sequences")
    for i, (seq, mask) in enumerate(zip(sequences, targets, strict=True)):
        if len(mask) != len(seq):
            raise ValueError(f"sequence {i}: a target mask of {len(mask)} flags for {len(seq)} tokens")
        if mask and mask[0]:
            raise ValueError(f"sequence {i}: its first token has no prefix and cannot be a target")
    model = policy.model
    device = policy.device
    flags = torch.tensor([bool(f) for mask in targets for f in mask], dtype=torch.bool, device=device)
    with policy.autocast():
        match layout:
            case "packed":
                batch = pack_sequences(sequences, device=device)
                hidden = packed_hidden_states(model, batch)
                target_idx = flags.nonzero().squeeze(-1)
                source = hidden[target_idx - 1]
                ids = batch.input_ids[0, target_idx]
            case "padded":
                padded_ids, hidden = padded_hidden_states(
                    model, sequences, pad_token_id=int(policy.tokenizer.pad_token_id or 0)
                )
                rows = torch.cat([torch.full((len(s),), r, device=device) for r, s in enumerate(sequences)])[
                    flags
                ]
                cols = torch.cat([torch.arange(len(s), device=device) for s in sequences])[flags]
                source = hidden[rows, cols - 1]
                ids = padded_ids[rows, cols]
            case "prefix_grouped":
                scored = prefix_grouped_sources(
                    model, sequences, pad_token_id=int(policy.tokenizer.pad_token_id or 0), needed=flags
                )
                source, ids = scored.source, scored.targets
            case _:
                assert_never(layout)
        _, lm_head = backbone_and_head(model)
        return target_token_logprobs(
            source, lm_head, ids, chunk_size=policy.logits_chunk_size, vocab_limit=policy.vocab_limit
        )


def target_token_logprobs(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    targets: torch.Tensor,
    *,
    chunk_size: int = 1024,
    vocab_limit: int | None = None,
) -> torch.Tensor:
    """``log softmax(lm_head(hidden)[:, :vocab_limit])`` at ``targets``: ``(M,)`` float32.

    The logits of all ``M`` rows are kept for backward when ``M <= chunk_size``; otherwise each chunk of
    ``chunk_size`` rows is recomputed in backward (checkpointing), so at most one chunk's logits exist at a time.
    A target at or above ``vocab_limit`` gets ``logit - logZ`` over the support, as in
    `mcprl_policy.packed.token_logprobs_and_entropy`.

    Args:
        hidden: ``(M, H)`` hidden states, row ``j`` predicting ``targets[j]``.
        lm_head: the output projection.
        targets: ``(M,)`` token ids.
        chunk_size: rows per chunk (>= 1).
        vocab_limit: the distribution's support is ids ``[0, vocab_limit)``; ``None``: every output row.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    def chunk_logprobs(h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        logits = lm_head(h).float()
        log_z = torch.logsumexp(logits[:, :vocab_limit], dim=-1)
        return logits.gather(-1, t[:, None]).squeeze(-1) - log_z

    rows = hidden.shape[0]
    if rows <= chunk_size:
        return chunk_logprobs(hidden, targets)
    recompute = torch.is_grad_enabled() and hidden.requires_grad
    chunks: list[torch.Tensor] = []
    for start in range(0, rows, chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if recompute:
            chunks.append(checkpoint(chunk_logprobs, h, t, use_reentrant=False))  # pyright: ignore[reportArgumentType]
        else:
            chunks.append(chunk_logprobs(h, t))
    return torch.cat(chunks)
