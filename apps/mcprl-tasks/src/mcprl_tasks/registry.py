"""Every task family by name."""

from __future__ import annotations

from mcprl_tasks.family import Family
from mcprl_tasks.finance_families import FINANCE_FAMILIES

__all__ = ["DEMO_FAMILIES", "FAMILIES"]

FAMILIES: dict[str, Family] = {f.name: f for f in FINANCE_FAMILIES}

DEMO_FAMILIES: tuple[str, ...] = ("quote", "quote_mul", "quote_ratio", "post_quote")
