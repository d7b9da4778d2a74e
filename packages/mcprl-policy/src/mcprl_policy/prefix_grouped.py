"""The training forward with each shared prefix computed once: the ``prefix_grouped`` layout.

The G episodes of a GRPO group start with the same prompt, and a policy that has learned the task often agrees
on the first turns as well: on the demo, the longest prefix common to a group is ~60 % of its tokens. The
``padded`` layout runs that prefix G times. This layout runs it once and lets every episode's remaining tokens
attend to its keys and values, as Prefix Grouper does for GRPO (Liu et al. 2025, "Prefix Grouper: Efficient
GRPO Training through Shared-Prefix Forward", arXiv:2506.05433, Sec. 3.2: the shared prefix's self-attention
computed once, each suffix's attention over the prefix's keys/values and its own). The result is the same
function of the weights as the padded forward, so losses and gradients agree to float rounding: backward sums
each suffix's gradient into the one prefix, where the padded layout sums G identical copies.

Two backbone calls per micro-batch:

1. the prefixes, one row per prefix group, right-padded, returning their keys/values (``use_cache``);
2. the suffixes, one row per sequence, right-padded, over a cache holding its group's prefix keys/values
   (a row without a shared prefix gets a fully masked one), positions continuing the prefix.

Groups are found by content (`prefix_groups`), not by GRPO group id: sorted sequences, adjacent ones sharing
a prefix. `pack_prefix_groups` fills micro-batches group by group so that a group is not split. Full-attention
decoders only (`check_packable`: a linear-attention layer's recurrent state cannot skip the prefix padding) and
not under gradient checkpointing (transformers then drops the prefix cache).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import attrs
import torch
from torch import nn
from transformers import DynamicCache

from mcprl_policy.attention import LINEAR_ATTENTION_LAYER, is_packable
from mcprl_policy.errors import UnpackableModelError
from mcprl_policy.packed import (
    PackedForward,
    backbone_and_head,
    check_token_ids,
    scored_forward,
    scored_tokens,
)

__all__ = [
    "MIN_SHARED_TOKENS",
    "PADDING_WASTE",
    "PrefixGroup",
    "ScoredSources",
    "check_prefix_groupable",
    "computed_tokens",
    "length_buckets",
    "pack_prefix_groups",
    "prefix_grouped_forward",
    "prefix_grouped_sources",
    "prefix_groups",
]

MIN_SHARED_TOKENS = 8
"""The shortest prefix worth a group: below it the second backbone call costs more than it saves."""

PADDING_WASTE = 0.15
"""How much padding a backbone call's bucket may add to its tokens (`length_buckets`)."""


@attrs.frozen(kw_only=True)
class PrefixGroup:
    """Sequences (indices into the forward's list) that share their first ``shared`` tokens (0: no sharing)."""

    members: tuple[int, ...]
    shared: int


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = 0
    while n < limit and a[n] == b[n]:
        n += 1
    return n


def prefix_groups(
    sequences: Sequence[Sequence[int]], *, min_shared: int = MIN_SHARED_TOKENS
) -> list[PrefixGroup]:
    """Partition ``sequences`` into groups sharing a prefix, saving the most tokens.

    Sorted by token ids, a run of sequences shares the least of its adjacent common prefixes, each capped one
    below the shorter sequence's length (every member keeps a suffix token: the prefix's last hidden state
    predicts it). A run of ``k`` sharing ``P >= min_shared`` tokens saves ``(k − 1) P``; the partition of the
    sorted order into runs with the largest total saving is found by dynamic programming over run ends
    (O(n²), n = the sequences of one micro-batch or one step). A single sequence shares nothing (0).
    """
    order = sorted(range(len(sequences)), key=lambda i: list(sequences[i]))
    adjacent = [
        _common(sequences[a], sequences[b], min(len(sequences[a]), len(sequences[b])) - 1)
        for a, b in itertools.pairwise(order)
    ]
    # best[j]: the largest saving over order[:j]; start[j]: where the last run of that partition starts.
    best = [0] * (len(order) + 1)
    start = [0] * (len(order) + 1)
    for j in range(1, len(order) + 1):
        best[j], start[j] = best[j - 1], j - 1
        shared = None
        for i in range(j - 2, -1, -1):  # the run order[i:j]
            shared = adjacent[i] if shared is None else min(shared, adjacent[i])
            if shared < min_shared:
                break
            if best[i] + (j - 1 - i) * shared > best[j]:
                best[j], start[j] = best[i] + (j - 1 - i) * shared, i
    groups: list[PrefixGroup] = []
    j = len(order)
    while j > 0:
        i = start[j]
        members = tuple(order[i:j])
        groups.append(
            PrefixGroup(members=members, shared=min(adjacent[i : j - 1]) if len(members) > 1 else 0)
        )
        j = i
    return groups[::-1]


def computed_tokens(lengths: Sequence[int], shared: int) -> int:
    """Tokens the backbone runs for sequences of ``lengths`` sharing ``shared`` leading tokens."""
    return sum(lengths) - (len(lengths) - 1) * shared if len(lengths) > 1 else sum(lengths)


def pack_prefix_groups(
    sequences: Sequence[Sequence[int]], max_tokens: int, *, min_shared: int = MIN_SHARED_TOKENS
) -> list[list[int]]:
    """Micro-batches of whole prefix groups, each computing at most ``max_tokens`` tokens where it can.

    Groups (`prefix_groups`) are taken in sorted order; a bin is closed when the next group does not fit. A group
    that alone exceeds the budget is cut into runs of members, each run computing the prefix once; a single
    sequence longer than the budget gets a bin of its own (never cut).

    Returns:
        Index lists into ``sequences``; every index appears once.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    runs: list[tuple[list[int], int]] = []  # (members, tokens computed)
    for group in prefix_groups(sequences, min_shared=min_shared):
        run: list[int] = []
        for m in group.members:
            cost = computed_tokens([len(sequences[j]) for j in (*run, m)], group.shared)
            if run and cost > max_tokens:
                runs.append((run, computed_tokens([len(sequences[j]) for j in run], group.shared)))
                run = []
            run.append(m)
        runs.append((run, computed_tokens([len(sequences[j]) for j in run], group.shared)))
    bins: list[list[int]] = []
    used = 0
    for run, cost in runs:
        if bins and used + cost <= max_tokens:
            bins[-1].extend(run)
            used += cost
        else:
            bins.append(list(run))
            used = cost
    return bins


def length_buckets(lengths: Sequence[int], *, waste: float = PADDING_WASTE) -> list[list[int]]:
    """Indices of ``lengths`` in buckets of similar length, shortest first, padding each to its longest.

    A bucket is closed when taking the next (longer) row would make its padded size exceed ``1 + waste`` times
    its tokens: a right-padded row costs its bucket's width, and one backbone call per bucket costs little
    beside that at these sizes.
    """
    buckets: list[list[int]] = []
    tokens = 0
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        if buckets and (len(buckets[-1]) + 1) * lengths[i] > (1.0 + waste) * (tokens + lengths[i]):
            buckets.append([])
            tokens = 0
        if not buckets:
            buckets.append([])
        buckets[-1].append(i)
        tokens += lengths[i]
    return buckets


def _right_padded(
    rows: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor(
        [[*r, *[pad_token_id] * (width - len(r))] for r in rows], dtype=torch.long, device=device
    )
    mask = torch.tensor(
        [[1] * len(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device
    )
    return ids, mask


def _stacked(rows: Sequence[torch.Tensor | None], width: int) -> torch.Tensor:
    """``(rows, kv_heads, width, head_dim)``: each prefix's keys or values right-padded with zeros (a row without
    a prefix all zeros: its mask hides every cached column)."""
    like = next(r for r in rows if r is not None)
    out = [
        torch.zeros_like(like[:, :1]).expand(-1, width, -1)
        if r is None
        else (
            r
            if r.shape[1] == width
            else torch.cat([r, r.new_zeros(r.shape[0], width - r.shape[1], r.shape[2])], 1)
        )
        for r in rows
    ]
    return torch.stack(out)


@attrs.frozen(kw_only=True, eq=False)
class _Prefix:
    """One group's prefix after its backbone call: keys/values per layer ``(kv_heads, shared, head_dim)``."""

    keys: tuple[torch.Tensor, ...]
    values: tuple[torch.Tensor, ...]
    hidden_at: int  # flat index of its first position in the forward's concatenated hidden states


def check_prefix_groupable(model: nn.Module) -> None:
    """Refuse models with linear-attention layers.

    Raises:
        UnpackableModelError: naming the layer type and the layout to use instead.
    """
    if not is_packable(model):
        raise UnpackableModelError(
            f"{type(model).__name__} has {LINEAR_ATTENTION_LAYER!r} layers: their recurrent state cannot resume "
            "from a shared prefix across its padding; use optim.layout: padded"
        )


def prefix_grouped_forward(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    value_head: nn.Module | None = None,
    chunk_size: int = 1024,
    pad_token_id: int = 0,
    vocab_limit: int | None = None,
    needed: torch.Tensor | None = None,
    min_shared: int = MIN_SHARED_TOKENS,
) -> PackedForward:
    """`mcprl_policy.packed.packed_forward`'s result with each shared prefix run once (module docstring).

    Args:
        model: a causal LM with full-attention layers, plain or peft-wrapped.
        sequences: token ids, one non-empty sequence each.
        temperature: divides the logits (> 0).
        value_head: maps ``(M, H)`` hidden states to ``(M,)`` values; ``None`` computes no values.
        chunk_size: rows per logits chunk (see `token_logprobs_and_entropy`).
        pad_token_id: fills padded positions (masked out of attention).
        vocab_limit: normalise over ids ``[0, vocab_limit)`` only (see `token_logprobs_and_entropy`).
        needed: ``(N,)`` bool over the concatenated tokens: score only these (`scored_tokens`).
        min_shared: the shortest prefix shared (`prefix_groups`).

    Raises:
        UnpackableModelError: the model has linear-attention layers.
        ValueError: no sequence, an empty one, an id outside the vocabulary, or a bad ``needed`` mask.
    """
    scored = prefix_grouped_sources(
        model, sequences, pad_token_id=pad_token_id, needed=needed, min_shared=min_shared
    )
    _, lm_head = backbone_and_head(model)
    return scored_forward(
        scored.source,
        scored.targets,
        scored.flat,
        lm_head=lm_head,
        value_head=value_head,
        seq_lens=[len(s) for s in sequences],
        temperature=temperature,
        chunk_size=chunk_size,
        vocab_limit=vocab_limit,
    )


@attrs.frozen(kw_only=True, eq=False)
class ScoredSources:
    """The backbone's side of a training forward: for each scored token ``j``, the hidden state that predicts it.

    ``source[j]`` (``(M, H)``) predicts ``targets[j]``, the token at ``flat[j]`` among the concatenated sequences.
    """

    source: torch.Tensor
    targets: torch.Tensor
    flat: torch.Tensor


def prefix_grouped_sources(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    pad_token_id: int = 0,
    needed: torch.Tensor | None = None,
    min_shared: int = MIN_SHARED_TOKENS,
) -> ScoredSources:
    """The backbone of `prefix_grouped_forward` (each shared prefix run once), stopping before the heads.

    The supervised forward (`mcprl_policy.supervised.target_logprobs`) puts its own head on these rows.

    Raises:
        UnpackableModelError: the model has linear-attention layers.
        ValueError: no sequence, an empty one, an id outside the vocabulary, or a bad ``needed`` mask.
    """
    if not sequences or min(len(s) for s in sequences) == 0:
        raise ValueError("prefix_grouped_forward needs at least one sequence and no empty sequence")
    check_prefix_groupable(model)
    device = next(model.parameters()).device
    backbone, _ = backbone_and_head(model)
    lens = [len(s) for s in sequences]
    all_ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=device)
    check_token_ids(model, all_ids[None])
    groups = [g for g in prefix_groups(sequences, min_shared=min_shared) if g.shared > 0]
    hidden_parts: list[torch.Tensor] = []
    flat = 0  # rows of hidden_parts so far
    prefixes: list[_Prefix] = []
    prefix_of: dict[int, int] = {}  # sequence -> its group's index in `prefixes`
    for bucket in length_buckets([g.shared for g in groups]):
        rows = [list(sequences[groups[b].members[0]][: groups[b].shared]) for b in bucket]
        ids, mask = _right_padded(rows, pad_token_id, device)
        out = backbone(input_ids=ids, attention_mask=mask, use_cache=True)
        if out.past_key_values is None:
            raise RuntimeError(
                "the prefix forward returned no keys/values (transformers turns its cache off under gradient "
                "checkpointing): use optim.layout=padded with gradient checkpointing"
            )
        width = ids.shape[1]
        hidden_parts.append(out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1]))
        layers = out.past_key_values.layers
        for row, b in enumerate(bucket):
            n = groups[b].shared
            for m in groups[b].members:
                prefix_of[m] = len(prefixes)
            prefixes.append(
                _Prefix(
                    keys=tuple(layer.keys[row, :, :n] for layer in layers),
                    values=tuple(layer.values[row, :, :n] for layer in layers),
                    hidden_at=flat + row * width,
                )
            )
        flat += len(bucket) * width
    shared_len = [0] * len(lens)
    for g in groups:
        for m in g.members:
            shared_len[m] = g.shared
    source_of = [0] * len(lens)  # flat hidden index of each sequence's suffix position 0
    for bucket in length_buckets([n - p for n, p in zip(lens, shared_len, strict=True)]):
        tails = [list(sequences[i][shared_len[i] :]) for i in bucket]
        ids, mask = _right_padded(tails, pad_token_id, device)
        width = ids.shape[1]
        cached = max(shared_len[i] for i in bucket)
        positions = torch.stack(
            [torch.arange(shared_len[i], shared_len[i] + width, device=device) for i in bucket]
        )
        cache = None
        if cached > 0:
            cache = DynamicCache(config=getattr(model, "config", None))
            for layer in range(len(prefixes[0].keys)):
                keys = [prefixes[prefix_of[i]].keys[layer] if i in prefix_of else None for i in bucket]
                values = [prefixes[prefix_of[i]].values[layer] if i in prefix_of else None for i in bucket]
                cache.update(_stacked(keys, cached), _stacked(values, cached), layer)
            prefix_mask = torch.tensor(
                [[1] * shared_len[i] + [0] * (cached - shared_len[i]) for i in bucket], device=device
            )
            mask = torch.cat([prefix_mask, mask], dim=1)
        out = backbone(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=cache is not None,
        )
        hidden_parts.append(out.last_hidden_state.reshape(-1, out.last_hidden_state.shape[-1]))
        for row, i in enumerate(bucket):
            source_of[i] = flat + row * width
        flat += len(bucket) * width
    hidden = torch.cat(hidden_parts) if len(hidden_parts) > 1 else hidden_parts[0]
    # Token t of sequence r is predicted by position t-1: its group's prefix row (t-1 < shared) or its suffix.
    flat_idx, seq, pos = scored_tokens(lens, needed, device="cpu")
    before = pos - 1
    shared = torch.tensor(shared_len)[seq]
    prefix_at = torch.tensor(
        [prefixes[prefix_of[i]].hidden_at if i in prefix_of else 0 for i in range(len(lens))]
    )
    source = torch.where(
        before < shared, prefix_at[seq] + before, torch.tensor(source_of)[seq] + before - shared
    ).to(device)
    flat_idx = flat_idx.to(device)
    return ScoredSources(source=hidden[source], targets=all_ids[flat_idx], flat=flat_idx)
