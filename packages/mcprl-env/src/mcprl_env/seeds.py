"""Per-request sampling seeds: a request's randomness is a function of what it is, not of when it arrives.

A sampler that batches concurrent episodes sees their requests in an order set by tool latency. Seeding each
request from its identity (the collection's seed, the episode id, the turn) instead of drawing from one shared
generator makes an episode's tokens independent of that order and of which other requests share its batch, so
the same checkpoint gives the same episodes (and a resumed run equals the uninterrupted one).
"""

from __future__ import annotations

import hashlib
import json

__all__ = ["SEED_BITS", "derive_seed", "turn_seed"]

SEED_BITS = 63
"""Derived seeds lie in ``[0, 2**63)``: valid for ``torch.Generator.manual_seed`` and a signed 64-bit int."""


def derive_seed(*parts: int | str) -> int:
    """A seed that is a hash of ``parts`` (BLAKE2b of their canonical JSON encoding, cut to `SEED_BITS`).

    Unlike an additive mix (``a * K + b``), distinct inputs collide only by chance (probability ~2**-63 per
    pair), and nearby inputs (step 3 vs 4, turn 0 vs 1) give unrelated seeds.

    Raises:
        TypeError: a part is neither an int nor a str (a bool is refused: ``True`` would alias ``1``).
    """
    for part in parts:
        if isinstance(part, bool) or not isinstance(part, int | str):
            raise TypeError(f"seed parts must be int or str, got {type(part).__name__}: {part!r}")
    encoded = json.dumps(list(parts), ensure_ascii=False, separators=(",", ":")).encode()
    digest = hashlib.blake2b(encoded, digest_size=8, person=b"mcprl-seed").digest()
    return int.from_bytes(digest, "big") >> (64 - SEED_BITS)


def turn_seed(seed: int, episode_id: str, turn: int) -> int:
    """The sampling seed of turn ``turn`` (0-based) of episode ``episode_id`` under collection seed ``seed``."""
    return derive_seed(seed, episode_id, turn)
