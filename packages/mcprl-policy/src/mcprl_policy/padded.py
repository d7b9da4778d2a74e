"""The training forward in one of three layouts, returning `PackedForward` each way.

- ``packed``: `Policy.forward_packed` — every sequence in one row with restarting positions; with a varlen
  attention implementation (`mcprl_policy.attention`: flash-attention-2 on CUDA, per-sequence SDPA otherwise)
  no token is padding and attention costs O(Σ nᵢ²). With plain ``sdpa``/``eager`` it falls back to a
  block-diagonal mask over the whole row (O(N²)). Not for models with linear-attention layers.
- ``padded``: right-padded rows of similar length with an attention mask: the padding is computed and thrown
  away, but any model runs it (measured against packed on the demo's length mix: benchmarks/RESULTS.md,
  bench_sampler).
- ``prefix_grouped``: padded rows with each prefix that sequences share (a GRPO group's prompt and the turns
  its episodes agree on) run once (`mcprl_policy.prefix_grouped`). Full-attention decoders only.

Both give, for each sequence, the logprob/entropy of token ``i`` given tokens ``< i`` (0 at the first
token), and values of the prefix when a value head is present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, assert_never

import torch
from torch import nn

from mcprl_policy.packed import (
    PackedForward,
    backbone_and_head,
    check_token_ids,
    scored_forward,
    scored_tokens,
)
from mcprl_policy.policy import Policy
from mcprl_policy.prefix_grouped import prefix_grouped_forward

__all__ = ["Layout", "padded_forward", "padded_hidden_states", "policy_forward"]

Layout = Literal["packed", "padded", "prefix_grouped"]


def policy_forward(
    policy: Policy,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float,
    values: bool,
    layout: Layout,
    needed: torch.Tensor | None = None,
) -> PackedForward:
    """Per-token logprobs, entropies (and values) of ``sequences`` in ``layout``, concatenated alike.

    Uses the live weights and the policy's `Policy.logits_chunk_size`; runs under autograd unless called
    inside ``torch.no_grad()``.

    Args:
        policy: the policy whose model (and value head) run.
        sequences: token ids, one non-empty sequence each.
        temperature: divides the logits; must equal the sampler's so that ratios start at 1.
        values: also compute values (when the policy has a value head).
        layout: ``packed`` (one row, varlen attention), ``padded`` (right-padded rows) or ``prefix_grouped``
            (shared prefixes once, then padded rows).
        needed: ``(N,)`` bool over the concatenated tokens: score only these (`scored_tokens`);
            ``None`` scores every token that has a prefix.
    """
    match layout:
        case "packed":
            return policy.forward_packed(sequences, temperature=temperature, values=values, needed=needed)
        case "padded" | "prefix_grouped":
            forward = padded_forward if layout == "padded" else prefix_grouped_forward
            return forward(
                policy.model,
                sequences,
                temperature=temperature,
                value_head=policy.value_head if values else None,
                chunk_size=policy.logits_chunk_size,
                pad_token_id=int(policy.tokenizer.pad_token_id or 0),
                vocab_limit=policy.vocab_limit,
                needed=needed,
            )
        case _:
            assert_never(layout)


def padded_forward(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    value_head: nn.Module | None = None,
    chunk_size: int = 1024,
    pad_token_id: int = 0,
    vocab_limit: int | None = None,
    needed: torch.Tensor | None = None,
) -> PackedForward:
    """`packed_forward`'s result computed over right-padded rows (see the module docstring).

    Args:
        model: a causal LM, plain or peft-wrapped.
        sequences: token ids, one non-empty sequence each; row ``r`` of the ``(S, max len)`` batch.
        temperature: divides the logits (> 0).
        value_head: maps ``(M, H)`` hidden states to ``(M,)`` values; ``None`` computes no values.
        chunk_size: rows per logits chunk (see `token_logprobs_and_entropy`).
        pad_token_id: fills the rows past each sequence's end (masked out of attention).
        vocab_limit: normalise over ids ``[0, vocab_limit)`` only (see `token_logprobs_and_entropy`).
        needed: ``(N,)`` bool over the concatenated tokens: score only these (`scored_tokens`).
    """
    device = next(model.parameters()).device
    lens = [len(s) for s in sequences]
    ids, hidden = padded_hidden_states(model, sequences, pad_token_id=pad_token_id)
    _, lm_head = backbone_and_head(model)
    # Scored token t of row r is predicted by position t-1 of that row.
    flat_idx, rows, cols = scored_tokens(lens, needed, device=device)
    return scored_forward(
        hidden[rows, cols - 1],
        ids[rows, cols],
        flat_idx,
        lm_head=lm_head,
        value_head=value_head,
        seq_lens=lens,
        temperature=temperature,
        chunk_size=chunk_size,
        vocab_limit=vocab_limit,
    )


def padded_hidden_states(
    model: nn.Module, sequences: Sequence[Sequence[int]], *, pad_token_id: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad ``sequences`` into ``(S, max len)`` ids and run the backbone: ``(ids, (S, max len, H) hidden)``.

    Raises:
        ValueError: no sequence, an empty one, or an id outside the model's vocabulary (`check_token_ids`).
    """
    device = next(model.parameters()).device
    lens = [len(s) for s in sequences]
    if not lens or min(lens) == 0:
        raise ValueError("padded_forward needs at least one sequence and no empty sequence")
    width = max(lens)
    ids = torch.full((len(lens), width), pad_token_id, dtype=torch.long, device=device)
    attention = torch.zeros((len(lens), width), dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, : lens[row]] = torch.tensor(list(seq), dtype=torch.long, device=device)
        attention[row, : lens[row]] = 1
    check_token_ids(model, ids)
    backbone, _ = backbone_and_head(model)
    return ids, backbone(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
