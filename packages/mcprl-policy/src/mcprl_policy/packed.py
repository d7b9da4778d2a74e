"""Training forward over packed (unpadded) sequences: per-token logprobs, entropies and values.

All sequences go into one row with ``position_ids`` restarting at 0 for each sequence. A model loaded with a
varlen implementation (`mcprl_policy.attention`: flash-attention-2, or per-sequence SDPA on CPU) gets the
sequences' boundaries as ``cu_seq_lens`` and attends within each sequence only; with ``sdpa`` or ``eager``
no 2-D attention mask is passed, which makes transformers build a block-diagonal causal mask
(``find_packed_sequence_indices``, O(N²) work). Models with linear-attention layers are refused
(`check_packable`). Logits are produced chunk by chunk
over the tokens, each chunk recomputed in backward when a chunk's logits would take more than
`KEEP_LOGITS_BYTES`, so a 150k vocabulary never materialises ``N × V`` logits at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import attrs
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mcprl_policy.attention import check_packable, uses_varlen

__all__ = [
    "KEEP_LOGITS_BYTES",
    "PackedBatch",
    "PackedForward",
    "backbone_and_head",
    "check_token_ids",
    "pack_sequences",
    "packed_forward",
    "packed_hidden_states",
    "scored_forward",
    "scored_tokens",
    "token_logprobs_and_entropy",
]


KEEP_LOGITS_BYTES = 32 * 2**20
"""A full chunk's float32 logits (``chunk_size × out_features × 4`` bytes) up to this size are kept for backward.

Autograd then saves a few tensors of that size per chunk (the logits, the log-softmax and its exponential),
memory that grows with the tokens as the backbone's activations do; above it each chunk is checkpointed
instead, which bounds the memory to one chunk's worth and costs a second forward of the head and the softmax
in backward. Either way the gradient is the same, bit for bit: the recomputation runs the same kernels on the
same inputs. The choice depends on the chunk size and the head only, never on the number of tokens, so every
data-parallel rank calls the head the same number of times (ZeRO-3 gathers its weights on each call).
"""


@attrs.frozen(kw_only=True, eq=False)
class PackedBatch:
    """Sequences concatenated into one row.

    Attributes:
        input_ids: ``(1, N)`` token ids.
        position_ids: ``(1, N)`` positions restarting at 0 for every sequence.
        seq_lens: length of each sequence (sum = N).
        cu_seqlens: ``(S + 1,)`` int32 cumulative lengths, starting at 0.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    seq_lens: tuple[int, ...]
    cu_seqlens: torch.Tensor


@attrs.frozen(kw_only=True, eq=False)
class PackedForward:
    """Per-token results of `packed_forward`, aligned with the packed tokens (shape ``(N,)`` each).

    ``logprobs[i]`` is the log-probability of token ``i`` given the tokens before it in its sequence,
    ``entropies[i]`` the entropy of that predictive distribution, and ``values[i]`` the value head's output
    on the same prefix (the state in which token ``i`` is chosen). ``valid`` marks the tokens computed: every
    token but each sequence's first (it has no prefix), or of those only the ones a forward's ``needed`` mask
    asked for (`scored_tokens`); the entries of the others are 0.
    """

    logprobs: torch.Tensor
    entropies: torch.Tensor
    values: torch.Tensor | None
    valid: torch.Tensor
    seq_lens: tuple[int, ...]

    def split(self, name: Literal["logprobs", "entropies", "values", "valid"]) -> list[torch.Tensor]:
        """One tensor per sequence for field ``name``."""
        tensor = getattr(self, name)
        if tensor is None:
            raise ValueError(f"{name} were not computed (value_head=None)")
        return list(torch.split(tensor, list(self.seq_lens)))


def pack_sequences(sequences: Sequence[Sequence[int]], *, device: torch.device | str = "cpu") -> PackedBatch:
    """Concatenate ``sequences`` into one row with restarting positions."""
    if not sequences or any(len(s) == 0 for s in sequences):
        raise ValueError("pack_sequences needs at least one sequence and no empty sequence")
    lens = tuple(len(s) for s in sequences)
    ids = torch.tensor([t for s in sequences for t in s], dtype=torch.long, device=device)
    positions = torch.cat([torch.arange(n, device=device) for n in lens])
    cu = torch.zeros(len(lens) + 1, dtype=torch.int32, device=device)
    cu[1:] = torch.cumsum(torch.tensor(lens, device=device), 0)
    return PackedBatch(input_ids=ids[None], position_ids=positions[None], seq_lens=lens, cu_seqlens=cu)


def token_logprobs_and_entropy(
    hidden: torch.Tensor,
    lm_head: nn.Module,
    targets: torch.Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    vocab_limit: int | None = None,
    keep_logits_bytes: int = KEEP_LOGITS_BYTES,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of ``targets`` and entropy under ``softmax(lm_head(hidden)[:, :vocab_limit] / temperature)``.

    Args:
        hidden: ``(M, H)`` hidden states, row ``j`` predicting ``targets[j]``.
        lm_head: the output projection.
        targets: ``(M,)`` token ids.
        temperature: divides the logits (> 0).
        chunk_size: rows per chunk; under autograd each chunk is recomputed in backward (checkpointing)
            unless a full chunk's float32 logits fit in ``keep_logits_bytes``.
        vocab_limit: the distribution's support is ids ``[0, vocab_limit)`` (`Policy.vocab_limit`, as the
            samplers draw); ``None``: every output row. A target at or above it (only possible in a prompt)
            gets ``logit - logZ`` over the support: finite, and never a sampled token's logprob.
        keep_logits_bytes: the most bytes of one full chunk's float32 logits
            (``chunk_size × lm_head.out_features × 4``) kept for backward instead of recomputed
            (`KEEP_LOGITS_BYTES`); 0 checkpoints every chunk. A head without an integer ``out_features`` is
            always checkpointed.

    Returns:
        ``(M,)`` float32 logprobs and ``(M,)`` float32 entropies.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")

    def chunk_stats(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = lm_head(h).float() / temperature
        support = logits[:, :vocab_limit]
        log_z = torch.logsumexp(support, dim=-1)
        logp = support - log_z[:, None]
        entropy = -(logp.exp() * logp).sum(-1)
        return logits.gather(-1, t[:, None]).squeeze(-1) - log_z, entropy

    if hidden.shape[0] == 0:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, empty.clone()
    if keep_logits_bytes < 0:
        raise ValueError(f"keep_logits_bytes must be >= 0, got {keep_logits_bytes}")
    out_features = getattr(lm_head, "out_features", None)
    recompute = (
        torch.is_grad_enabled()
        and hidden.requires_grad
        and not (isinstance(out_features, int) and chunk_size * out_features * 4 <= keep_logits_bytes)
    )
    logprobs, entropies = [], []
    for start in range(0, hidden.shape[0], chunk_size):
        h, t = hidden[start : start + chunk_size], targets[start : start + chunk_size]
        if recompute:
            lp, ent = checkpoint(chunk_stats, h, t, use_reentrant=False)  # pyright: ignore[reportGeneralTypeIssues]
        else:
            lp, ent = chunk_stats(h, t)
        logprobs.append(lp)
        entropies.append(ent)
    return torch.cat(logprobs), torch.cat(entropies)


def scored_tokens(
    lengths: Sequence[int], needed: torch.Tensor | None, *, device: torch.device | str
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The tokens a training forward scores over sequences of ``lengths`` concatenated, and where each sits.

    Every token but a sequence's first (nothing predicts it) is scored, or of those only the ``needed`` ones:
    the output head, its softmax and their backward run once per scored token. A policy-gradient loss reads
    only the action tokens (the rest are prompt, tool output and template: about 70 % of a multi-turn
    episode's tokens), so a learner passes its action mask as ``needed`` and the head's work shrinks by that
    much; the backbone still runs over every token (each is context for the next).

    Args:
        lengths: each sequence's length.
        needed: ``(N,)`` bool over the ``N = sum(lengths)`` concatenated tokens, or ``None`` for all of them.
        device: where the returned indices live.

    Returns:
        ``(flat, seq, pos)``, each ``(M,)``: scored token ``j`` is token ``pos[j]`` (>= 1) of sequence
        ``seq[j]``, at ``flat[j]`` among the concatenated tokens.

    Raises:
        ValueError: ``needed`` is not a bool tensor of shape ``(N,)``.
    """
    sizes = torch.tensor(list(lengths), device=device)
    seq_of = torch.repeat_interleave(torch.arange(len(sizes), device=device), sizes)
    pos = torch.arange(int(sizes.sum()), device=device) - (sizes.cumsum(0) - sizes)[seq_of]
    keep = pos > 0
    if needed is not None:
        if needed.dtype != torch.bool or needed.shape != keep.shape:
            raise ValueError(
                f"needed must be a bool mask of shape {tuple(keep.shape)} (one entry per token), got "
                f"{needed.dtype} {tuple(needed.shape)}"
            )
        keep &= needed.to(device)
    flat = keep.nonzero().squeeze(-1)
    return flat, seq_of[flat], pos[flat]


def scored_forward(
    source: torch.Tensor,
    targets: torch.Tensor,
    scored: torch.Tensor,
    *,
    lm_head: nn.Module,
    value_head: nn.Module | None,
    seq_lens: Sequence[int],
    temperature: float,
    chunk_size: int,
    vocab_limit: int | None,
) -> PackedForward:
    """The heads on the scored tokens, laid out over all of them: a training forward's last part.

    Args:
        source: ``(M, H)`` hidden states, row ``j`` the position before scored token ``j``.
        targets: ``(M,)`` the scored tokens' ids.
        scored: ``(M,)`` their flat indices among the ``sum(seq_lens)`` concatenated tokens.
        lm_head: the output projection (`token_logprobs_and_entropy` with ``temperature``, ``chunk_size``,
            ``vocab_limit``).
        value_head: maps ``(M, H)`` to ``(M,)`` values; ``None`` computes no values.
        seq_lens: each sequence's length.
    """
    lp, ent = token_logprobs_and_entropy(
        source, lm_head, targets, temperature=temperature, chunk_size=chunk_size, vocab_limit=vocab_limit
    )
    total = sum(seq_lens)

    def scatter(x: torch.Tensor) -> torch.Tensor:
        return source.new_zeros(total, dtype=torch.float32).index_put((scored,), x.float())

    valid = torch.zeros(total, dtype=torch.bool, device=source.device)
    valid[scored] = True
    return PackedForward(
        logprobs=scatter(lp),
        entropies=scatter(ent),
        values=scatter(value_head(source)) if value_head is not None else None,
        valid=valid,
        seq_lens=tuple(seq_lens),
    )


def check_token_ids(model: nn.Module, input_ids: torch.Tensor) -> None:
    """Refuse ids outside ``model``'s embedding table before the forward (torch would raise a bare IndexError).

    Raises:
        ValueError: naming the vocabulary size and the offending ids.
    """
    vocab = int(model.get_input_embeddings().num_embeddings)  # pyright: ignore[reportCallIssue, reportAttributeAccessIssue]
    bad = input_ids[(input_ids < 0) | (input_ids >= vocab)]
    if bad.numel():
        raise ValueError(
            f"token ids outside the model's vocabulary (size {vocab}): {bad.unique()[:5].tolist()} "
            "(sequences tokenized with a different tokenizer?)"
        )


def packed_forward(
    model: nn.Module,
    sequences: Sequence[Sequence[int]],
    *,
    temperature: float = 1.0,
    value_head: nn.Module | None = None,
    chunk_size: int = 1024,
    vocab_limit: int | None = None,
    needed: torch.Tensor | None = None,
) -> PackedForward:
    """Run a causal LM (plain or peft-wrapped) once over packed ``sequences``; see `PackedForward`.

    ``vocab_limit`` restricts the distribution to ids ``[0, vocab_limit)`` (see `token_logprobs_and_entropy`);
    ``needed`` (``(N,)`` bool) scores only those tokens (`scored_tokens`).
    """
    device = next(model.parameters()).device
    batch = pack_sequences(sequences, device=device)
    hidden = packed_hidden_states(model, batch)
    _, lm_head = backbone_and_head(model)
    # Row i-1 predicts token i: the source rows are every row whose successor is in the same sequence.
    target_idx, _, _ = scored_tokens(batch.seq_lens, needed, device=device)
    return scored_forward(
        hidden[target_idx - 1],
        batch.input_ids[0, target_idx],
        target_idx,
        lm_head=lm_head,
        value_head=value_head,
        seq_lens=batch.seq_lens,
        temperature=temperature,
        chunk_size=chunk_size,
        vocab_limit=vocab_limit,
    )


def packed_hidden_states(model: nn.Module, batch: PackedBatch) -> torch.Tensor:
    """The backbone's last hidden states ``(N, H)`` of ``batch``, attention kept inside each sequence.

    Raises:
        UnpackableModelError: the model has linear-attention layers (`check_packable`).
        ValueError: an id outside the model's vocabulary (`check_token_ids`).
    """
    check_packable(model)
    check_token_ids(model, batch.input_ids)
    backbone, _ = backbone_and_head(model)
    return backbone(
        input_ids=batch.input_ids,
        position_ids=batch.position_ids,
        use_cache=False,
        **_boundaries(model, batch),
    ).last_hidden_state[0]


def _boundaries(model: nn.Module, batch: PackedBatch) -> dict[str, torch.Tensor | int]:
    """The backbone's keyword arguments that keep attention inside each packed sequence.

    For varlen implementations: the cumulative lengths (transformers' ``FlashAttentionKwargs``) and an all-ones
    2-D mask, which stops transformers from building the block-diagonal mask it would derive from the
    restarting positions (with no padding, the mask builders then return no mask at all).
    """
    if not uses_varlen(model):
        return {}
    longest = max(batch.seq_lens)
    return {
        "attention_mask": torch.ones_like(batch.input_ids),
        "cu_seq_lens_q": batch.cu_seqlens,
        "cu_seq_lens_k": batch.cu_seqlens,
        "max_length_q": longest,
        "max_length_k": longest,
    }


def backbone_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The decoder stack and output projection of a causal LM, looking through peft wrappers."""
    base: Any = model
    get_base = getattr(model, "get_base_model", None)
    if callable(get_base):
        base = get_base()
    prefix = getattr(base, "base_model_prefix", "model")
    backbone = getattr(base, prefix, None)
    head = base.get_output_embeddings() if hasattr(base, "get_output_embeddings") else None
    if not isinstance(backbone, nn.Module) or not isinstance(head, nn.Module):
        raise TypeError(
            f"{type(base).__name__} is not a causal LM with a '{prefix}' backbone and an output head"
        )
    return backbone, head
