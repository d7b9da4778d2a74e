"""Compact JSON rendering of tool results and the per-episode id carried in a request's ``_meta``."""

from __future__ import annotations

import json
from typing import Any

from mcp.server.mcpserver import Context

__all__ = ["DEFAULT_EPISODE_ID", "EPISODE_META_KEY", "episode_id_of", "to_json"]

EPISODE_META_KEY = "mcprl/episode_id"
DEFAULT_EPISODE_ID = "default"


def to_json(value: object) -> str:
    """Render a tool result as compact JSON (no spaces; the tiny demo model reads every byte).

    Args:
        value: A JSON-serialisable value.

    Returns:
        The JSON text with ``(",", ":")`` separators and non-ASCII kept as is.
    """
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def episode_id_of(ctx: Context[Any, Any]) -> str:
    """The episode a request belongs to: ``_meta["mcprl/episode_id"]``, or ``"default"`` when absent.

    Args:
        ctx: The tool call's context (inject it with a ``ctx: Context`` parameter).

    Returns:
        The episode id as a non-empty string.
    """
    meta = ctx.request_context.meta
    if not meta:
        return DEFAULT_EPISODE_ID
    value = meta.get(EPISODE_META_KEY)
    if value is None or value == "":
        return DEFAULT_EPISODE_ID
    return str(value)
