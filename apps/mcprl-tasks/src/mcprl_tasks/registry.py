"""Every task family by name."""

from __future__ import annotations

from mcprl_tasks.family import Family
from mcprl_tasks.finance_families import FINANCE_FAMILIES
from mcprl_tasks.messaging_families import MESSAGING_FAMILIES
from mcprl_tasks.search_families import SEARCH_FAMILIES

__all__ = ["DEMO_FAMILIES", "FAMILIES"]

FAMILIES: dict[str, Family] = {f.name: f for f in (*FINANCE_FAMILIES, *SEARCH_FAMILIES, *MESSAGING_FAMILIES)}

DEMO_FAMILIES: tuple[str, ...] = ("quote", "quote_mul", "quote_ratio", "post_quote")
