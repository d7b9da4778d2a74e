"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole turn is ``{"name": ..., "parameters": {...}}``.

Meta's template renders a call as that JSON object alone in the assistant turn; the model may open it with
``<|python_tag|>`` (a special token: usually gone from decoded text, handled when it is kept) and may write
several objects separated by ``;`` (as vLLM's ``llama3_json`` parser accepts). A turn is a call attempt when,
after think blocks and an optional ``<|python_tag|>``, it starts with ``{``; any other turn is a final answer.
Text before ``<|python_tag|>`` is the turn's content. ``arguments`` is accepted for ``parameters``.
"""

from __future__ import annotations

import attrs

from mcprl_env.errors import ToolCallParseError
from mcprl_env.parsing.base import (
    ParsedTurn,
    ToolCall,
    ToolSchemas,
    call_from_object,
    decode_json_object,
    make_turn,
    split_thinking,
    too_large,
)

__all__ = ["PYTHON_TAG", "Llama3JsonToolCallParser"]

PYTHON_TAG = "<|python_tag|>"


@attrs.frozen(kw_only=True)
class Llama3JsonToolCallParser:
    """Llama 3.x ``{"name": ..., "parameters": {...}}`` parser (``<|python_tag|>`` optional).

    Args:
        max_call_chars: Longest call text parsed; longer text is a ``too_large`` error.
    """

    max_call_chars: int = attrs.field(default=65_536, validator=attrs.validators.gt(0))

    def parse(self, text: str, *, tools: ToolSchemas | None = None) -> ParsedTurn:
        """Parse one assistant turn's text; ``tools`` is not needed."""
        del tools
        visible, thinking = split_thinking(text)
        content, tag, body = visible.partition(PYTHON_TAG)
        if not tag:
            content, body = "", visible
        if not tag and not body.lstrip().startswith("{"):
            return make_turn([], visible, thinking)
        return make_turn(self._parse_calls(body), content, thinking)

    def _parse_calls(self, body: str) -> list[ToolCall | ToolCallParseError]:
        error = too_large(body, self.max_call_chars)
        if error is not None:
            return [error]
        rest = body.strip()
        if not rest:
            return [ToolCallParseError("empty_call", f"nothing after {PYTHON_TAG}", raw=body)]
        items: list[ToolCall | ToolCallParseError] = []
        while True:
            decoded = decode_json_object(rest, body, where="as a tool call")
            if isinstance(decoded, ToolCallParseError):
                return [*items, decoded]
            value, end = decoded
            items.append(call_from_object(value, rest[:end]))
            rest = rest[end:].strip()
            if not rest:
                return items
            if not rest.startswith(";"):
                return [
                    *items,
                    ToolCallParseError("invalid_json", "text after the JSON tool call", raw=rest),
                ]
            rest = rest[1:].strip()
            if not rest:
                return items
