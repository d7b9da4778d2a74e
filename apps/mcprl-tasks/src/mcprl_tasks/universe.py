"""What task families draw from: the finance fixture's companies and a prompt style."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from mcprl_servers.fixture import load_fixture

__all__ = ["PromptStyle", "Universe"]

PromptStyle = Literal["short", "natural"]


@dataclass(frozen=True, kw_only=True)
class Universe:
    """The symbols a task set draws from and how its prompts are phrased.

    Args:
        symbols: Ticker symbols (all must exist in the finance fixture).
        style: ``short`` prompts for the tiny demo model ("Price of HLDR times 3?") or ``natural`` ones.
        multipliers: Integer multipliers for ``quote_mul``.
    """

    symbols: tuple[str, ...]
    style: PromptStyle = "natural"
    multipliers: tuple[int, ...] = (2, 3, 4, 5, 6, 7, 8, 9)

    def __post_init__(self) -> None:
        missing = [s for s in self.symbols if s not in self.companies]
        if missing:
            raise ValueError(f"symbols not in the finance fixture: {', '.join(missing)}")
        if len(self.symbols) < 2:
            raise ValueError("a universe needs at least 2 symbols")

    @classmethod
    def first(cls, n: int, *, style: PromptStyle = "natural") -> Universe:
        """The first ``n`` companies of the fixture (generation order)."""
        return cls(symbols=tuple(list(load_fixture()["companies"])[:n]), style=style)

    @cached_property
    def companies(self) -> dict[str, Any]:
        """The fixture's companies keyed by symbol."""
        return load_fixture()["companies"]

    def price(self, symbol: str) -> float:
        """The price ``get_quote`` returns for ``symbol``."""
        return float(self.companies[symbol]["prices"][-1][3])

    def price_text(self, symbol: str) -> str:
        """The price exactly as it appears in ``get_quote``'s JSON (``49.53``, ``21.0``)."""
        return json.dumps(self.price(symbol))

    def name(self, symbol: str) -> str:
        """The company name of ``symbol``."""
        return str(self.companies[symbol]["profile"]["name"])

    def profile(self, symbol: str) -> dict[str, Any]:
        """The company profile ``get_profile`` returns."""
        return self.companies[symbol]["profile"]
