"""Hermes / Qwen2.5 / Qwen3 tool calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``.

Tolerant where a user would expect it (whitespace around tags and JSON, text before and after calls,
``<think>`` blocks, a JSON-string ``arguments`` that decodes to an object, ``parameters`` for ``arguments``);
strict where a guess could corrupt training (unclosed or nested tags, trailing text inside a tag, JSON that is
not an object, a missing name, arguments that are not an object, unknown keys). Every failure is a typed
`ToolCallParseError` with a kind, kept in order with the calls so the episode can answer each one.
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
    scan_tagged_calls,
    split_thinking,
    too_large,
)

__all__ = ["HermesToolCallParser"]


@attrs.frozen(kw_only=True)
class HermesToolCallParser:
    """Hermes/Qwen-style ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` parser.

    Args:
        max_call_chars: Longest call body parsed; longer bodies are a ``too_large`` error (a 10 MB argument
            never reaches ``json.loads``).
    """

    max_call_chars: int = attrs.field(default=65_536, validator=attrs.validators.gt(0))

    def parse(self, text: str, *, tools: ToolSchemas | None = None) -> ParsedTurn:
        """Parse one assistant turn's text (special tokens already removed); ``tools`` is not needed."""
        del tools
        visible, thinking = split_thinking(text)
        items, outside = scan_tagged_calls(
            visible, open_tag="<tool_call>", close_tag="</tool_call>", parse_body=self._parse_body
        )
        return make_turn(items, outside, thinking)

    def _parse_body(self, body: str) -> ToolCall | ToolCallParseError:
        error = too_large(body, self.max_call_chars)
        if error is not None:
            return error
        stripped = body.strip()
        if not stripped:
            return ToolCallParseError("empty_call", "empty <tool_call></tool_call>", raw=body)
        decoded = decode_json_object(stripped, body, where="inside <tool_call>")
        if isinstance(decoded, ToolCallParseError):
            return decoded
        value, end = decoded
        if stripped[end:].strip():
            return ToolCallParseError(
                "invalid_json", "text after the JSON object inside <tool_call>", raw=body
            )
        return call_from_object(value, body)
