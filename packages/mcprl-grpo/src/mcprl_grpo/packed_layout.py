"""The layout of a packed micro-batch, validated once: sequences back to back in ``(L,)``, with their offsets.

Functions that take packed ``(L,)`` tensors take ``seq_ids`` ``(L,)`` (each token's sequence index). Given the
bare tensor they check it and, for sums per sequence, find where each sequence starts on every call; a learner
that passes the same ids to several functions per micro-batch builds a `PackedLayout` once instead
(`PackedLayout.from_seq_ids` or `PackedLayout.from_lengths`, e.g. from ``cu_seqlens``) and passes that.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from mcprl_grpo.errors import ArgumentError, DTypeError, ShapeError

CHUNK = 32


def chunk_of(positions: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For positions in ``[0, length]`` of an ``(L,)`` tensor viewed as ``(ceil(L / CHUNK), CHUNK)`` rows: each
    position's row, and which of that row's entries lie before the position (``(K, CHUNK)`` bool)."""
    rows = max(-(-length // CHUNK), 1)
    row = torch.div(positions, CHUNK, rounding_mode="floor").clamp(max=rows - 1)
    keep = torch.arange(CHUNK, device=positions.device) < (positions - row * CHUNK).unsqueeze(-1)
    return row, keep


def _check_integer(name: str, x: torch.Tensor) -> None:
    if x.dim() != 1:
        raise ShapeError(name, x.shape, "(L,)" if name == "seq_ids" else "(S,)")
    if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
        raise DTypeError(f"{name} must be an integer tensor, got dtype {x.dtype}")


@dataclass(frozen=True, eq=False)
class PackedLayout:
    """``ids`` ``(L,)`` int64, non-decreasing; ``offsets`` ``(S + 1,)`` int64, sequence ``s`` is
    ``ids[offsets[s]:offsets[s + 1]]`` (possibly empty); ``boundary_chunks`` is `chunk_of` the offsets, kept for
    the sums per sequence. Build it with `from_seq_ids` or `from_lengths`."""

    ids: torch.Tensor
    offsets: torch.Tensor
    boundary_chunks: tuple[torch.Tensor, torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.ids.dtype != torch.int64 or self.offsets.dtype != torch.int64 or self.offsets.dim() != 1:
            raise DTypeError(
                "PackedLayout holds int64 ids and offsets; build it with from_seq_ids or from_lengths"
            )
        if self.offsets.numel() == 0 or self.ids.shape != (int(self.offsets[-1]),):
            raise ShapeError(
                "ids", self.ids.shape, f"({int(self.offsets[-1]) if self.offsets.numel() else 0},)"
            )
        object.__setattr__(self, "boundary_chunks", chunk_of(self.offsets, self.ids.numel()))

    @property
    def num_seqs(self) -> int:
        """``S``, the number of sequences (ids run from 0 to ``S - 1``)."""
        return self.offsets.numel() - 1

    @property
    def shape(self) -> torch.Size:
        return self.ids.shape

    @classmethod
    def from_seq_ids(cls, seq_ids: torch.Tensor) -> PackedLayout:
        """The layout of ``seq_ids`` ``(L,)``: non-negative, non-decreasing integers (sequences back to back).

        Raises:
            ShapeError: ``seq_ids`` is not 1-D.
            DTypeError: ``seq_ids`` is not an integer tensor.
            ArgumentError: a negative id, or ids that decrease (interleaved sequences: pass the tensor itself).
        """
        _check_integer("seq_ids", seq_ids)
        ids = seq_ids.long()
        if ids.numel() == 0:
            return cls(ids=ids, offsets=torch.zeros(1, dtype=torch.int64, device=ids.device))
        if int(ids[0]) < 0:
            raise ArgumentError("seq_ids must be non-negative")
        if ids.numel() > 1 and int(torch.diff(ids).min()) < 0:
            raise ArgumentError(
                "seq_ids must be non-decreasing for a PackedLayout (sequences back to back); "
                "pass interleaved ids as a tensor instead"
            )
        offsets = torch.searchsorted(ids, torch.arange(int(ids[-1]) + 2, device=ids.device))
        return cls(ids=ids, offsets=offsets)

    @classmethod
    def from_lengths(cls, lengths: torch.Tensor) -> PackedLayout:
        """The layout of sequences of ``lengths`` ``(S,)`` tokens packed back to back (zero lengths allowed).

        Raises:
            ShapeError: ``lengths`` is not 1-D.
            DTypeError: ``lengths`` is not an integer tensor.
            ArgumentError: a negative length.
        """
        _check_integer("lengths", lengths)
        n = lengths.long()
        if n.numel() and int(n.min()) < 0:
            raise ArgumentError("lengths must be non-negative")
        offsets = torch.zeros(n.numel() + 1, dtype=torch.int64, device=n.device)
        torch.cumsum(n, 0, out=offsets[1:])
        ids = torch.arange(n.numel(), device=n.device).repeat_interleave(n)
        return cls(ids=ids, offsets=offsets)


SeqIds = torch.Tensor | PackedLayout
