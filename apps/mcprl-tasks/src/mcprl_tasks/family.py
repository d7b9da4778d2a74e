"""A task family: a combination space (what is held out) and a builder that phrases one task."""

from __future__ import annotations

import random
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from mcprl_tasks.schema import Difficulty
from mcprl_tasks.universe import Universe

__all__ = ["Draft", "Family"]

Combo = tuple[Hashable, ...]


@dataclass(frozen=True, kw_only=True)
class Draft:
    """One task before it gets an id."""

    prompt: str
    servers: list[str]
    difficulty: Difficulty
    answer: str | None
    checker: dict[str, Any]
    min_tool_calls: int
    params: dict[str, Any]


@dataclass(frozen=True, kw_only=True)
class Family:
    """A task family.

    Args:
        name: Registry name (``metadata.family``).
        combos: The family's combination space for a universe (e.g. every ``(symbol, multiplier)``); the
            validation split draws only from held-out combinations.
        build: Phrase one task for a combination (``rng`` picks the wording).
    """

    name: str
    combos: Callable[[Universe], list[Combo]]
    build: Callable[[Combo, random.Random, Universe], Draft]
