"""The training forward in one of two layouts, returning `mcprl_policy.PackedForward` either way.

- ``packed``: `Policy.forward_packed` — every sequence in one row with restarting positions and a
  block-diagonal causal mask. Right for GPUs (flash-attention varlen kernels skip the masked blocks).
- ``padded``: right-padded rows of similar length with an attention mask. On CPU the sdpa kernels compute the
  full ``N x N`` scores of a packed row (the block-diagonal mask only zeroes them), so for many short
  sequences padding to the longest of a length-sorted micro-batch is several times cheaper (measured on the
  demo's episodes; see benchmarks/RESULTS.md).

Both give, for each sequence, the logprob/entropy of token ``i`` given tokens ``< i`` (0 at the first
token), and values of the prefix when a value head is present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch

from mcprl_policy import PackedForward
from mcprl_policy.packed import check_token_ids, token_logprobs_and_entropy

__all__ = ["Layout", "policy_forward"]

Layout = Literal["packed", "padded"]


def policy_forward(
    policy: Any,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float,
    values: bool,
    layout: Layout,
) -> PackedForward:
    """Per-token logprobs, entropies (and values) of `sequences`, concatenated like `forward_packed`."""
    match layout:
        case "packed":
            return policy.forward_packed(sequences, temperature=temperature, values=values)
        case "padded":
            return padded_forward(policy, sequences, temperature=temperature, values=values)


def padded_forward(
    policy: Any, sequences: Sequence[Sequence[int]], *, temperature: float, values: bool
) -> PackedForward:
    """`Policy.forward_packed`'s result computed over right-padded rows (see the module docstring)."""
    model = policy.model
    device = next(model.parameters()).device
    lens = [len(s) for s in sequences]
    if not lens or min(lens) == 0:
        raise ValueError("padded_forward needs at least one sequence and no empty sequence")
    width = max(lens)
    pad = int(policy.tokenizer.pad_token_id or 0)
    ids = torch.full((len(lens), width), pad, dtype=torch.long, device=device)
    attention = torch.zeros((len(lens), width), dtype=torch.long, device=device)
    for row, seq in enumerate(sequences):
        ids[row, : lens[row]] = torch.tensor(list(seq), dtype=torch.long, device=device)
        attention[row, : lens[row]] = 1
    check_token_ids(model, ids)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    backbone = getattr(base, base.base_model_prefix)
    hidden = backbone(input_ids=ids, attention_mask=attention, use_cache=False).last_hidden_state
    # Row r, position t-1 predicts token t for 1 <= t < len_r.
    rows = torch.cat([torch.full((n - 1,), r, device=device) for r, n in enumerate(lens)])
    cols = torch.cat([torch.arange(1, n, device=device) for n in lens])
    source = hidden[rows, cols - 1]
    lp, ent = token_logprobs_and_entropy(
        source, base.get_output_embeddings(), ids[rows, cols], temperature=temperature,
        chunk_size=getattr(policy, "logits_chunk_size", 1024),
    )  # fmt: skip
    starts = torch.tensor([0, *lens[:-1]], device=device).cumsum(0)
    flat_idx = torch.cat([starts[r] + torch.arange(1, n, device=device) for r, n in enumerate(lens)])
    total = sum(lens)
    logprobs = hidden.new_zeros(total, dtype=torch.float32).index_put((flat_idx,), lp)
    entropies = hidden.new_zeros(total, dtype=torch.float32).index_put((flat_idx,), ent)
    valid = torch.zeros(total, dtype=torch.bool, device=device)
    valid[flat_idx] = True
    value_out = None
    if values and getattr(policy, "value_head", None) is not None:
        v = policy.value_head(source)
        value_out = hidden.new_zeros(total, dtype=torch.float32).index_put((flat_idx,), v.float())
    return PackedForward(
        logprobs=logprobs, entropies=entropies, values=value_out, valid=valid, seq_lens=tuple(lens)
    )
