"""Qwen3.5 / Qwen3-Coder tool calls: XML with one element per argument.

```
<tool_call>
<function=NAME>
<parameter=ARG>
value
</parameter>
</function>
</tool_call>
```

An argument's value is text; the template writes strings as they are, numbers and booleans with Jinja's
``string`` filter and objects and arrays as JSON. As in vLLM's ``qwen3_coder`` parser, the tool's schema decides
what the text becomes: ``integer``/``number`` → a number, ``boolean`` → ``true``/``false`` (any case),
``object``/``array`` → JSON, ``null`` → None (when the schema allows null); a type that allows strings
(``["string", "integer"]``, ``anyOf``), anything else, an argument the schema does not type, and text that does
not convert stay a string (a type the tool rejects is then the model's error, reported by the
tool's argument validation).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

from mcprl_env.errors import ToolCallParseError
from mcprl_env.parsing.base import (
    ParsedTurn,
    ToolCall,
    ToolSchemas,
    make_turn,
    scan_tagged_calls,
    split_thinking,
    too_large,
)

__all__ = ["QwenXmlToolCallParser", "convert_argument"]

_FUNCTION = re.compile(r"<function=([^>\n]*)>")
_PARAMETER = "<parameter="
_PARAMETER_END = "</parameter>"
_FUNCTION_END = "</function>"


def _types(schema: Mapping[str, Any] | None) -> list[str]:
    if not schema:
        return []
    declared = schema.get("type")
    types = [declared] if isinstance(declared, str) else list(declared) if isinstance(declared, list) else []
    for key in ("anyOf", "oneOf"):
        for sub in schema.get(key) or []:
            if isinstance(sub, Mapping):
                types.extend(_types(sub))
    return [str(t).lower() for t in types]


def convert_argument(text: str, schema: Mapping[str, Any] | None) -> Any:
    """The value of one XML argument whose property schema is ``schema`` (None: untyped → the text)."""
    types = _types(schema)
    if not types or ("string" in types and text.lower() != "null"):
        return text
    for kind in types:
        match kind:
            case "null" if text.lower() in ("null", "none"):
                return None
            case "integer" | "number":
                try:
                    value = json.loads(text.strip())
                except ValueError:  # not JSON, or an integer literal past Python's digit limit
                    continue
                if isinstance(value, int | float) and not isinstance(value, bool):
                    if kind == "integer" and isinstance(value, float):
                        continue
                    return value
            case "boolean" if text.strip().lower() in ("true", "false"):
                return text.strip().lower() == "true"
            case "object" | "array":
                try:
                    value = json.loads(text)
                except (ValueError, RecursionError):
                    continue
                if isinstance(value, dict if kind == "object" else list):
                    return value
            case _:
                pass
    return text


def _properties(tools: ToolSchemas | None, name: str) -> Mapping[str, Any]:
    for tool in tools or ():
        fn = tool.get("function", tool)
        if isinstance(fn, Mapping) and fn.get("name") == name:
            params = fn.get("parameters")
            if isinstance(params, Mapping):
                props = params.get("properties")
                return props if isinstance(props, Mapping) else {}
    return {}


@attrs.frozen(kw_only=True)
class QwenXmlToolCallParser:
    """Qwen3.5 / Qwen3-Coder ``<tool_call><function=NAME><parameter=ARG>...`` parser.

    Args:
        max_call_chars: Longest call body parsed; longer bodies are a ``too_large`` error.
    """

    max_call_chars: int = attrs.field(default=65_536, validator=attrs.validators.gt(0))

    def parse(self, text: str, *, tools: ToolSchemas | None = None) -> ParsedTurn:
        """Parse one assistant turn; ``tools`` types the arguments (see `convert_argument`)."""
        visible, thinking = split_thinking(text)
        items, outside = scan_tagged_calls(
            visible,
            open_tag="<tool_call>",
            close_tag="</tool_call>",
            parse_body=lambda body: self._parse_body(body, tools),
        )
        if not items and _FUNCTION.search(outside):
            # A bare <function=...> is an attempted call the model must be told about, not a final answer.
            items.append(
                ToolCallParseError(
                    "unopened_tag", "<function=...> outside <tool_call></tool_call>", raw=outside
                )
            )
        return make_turn(items, outside, thinking)

    def _parse_body(self, body: str, tools: ToolSchemas | None) -> ToolCall | ToolCallParseError:
        error = too_large(body, self.max_call_chars)
        if error is not None:
            return error
        stripped = body.strip()
        if not stripped:
            return ToolCallParseError("empty_call", "empty <tool_call></tool_call>", raw=body)
        head = _FUNCTION.match(stripped)
        if head is None:
            return ToolCallParseError("invalid_xml", "expected <function=NAME> inside <tool_call>", raw=body)
        name = head.group(1).strip()
        if not name:
            return ToolCallParseError("invalid_name", "<function=> has no name", raw=body)
        if not stripped.endswith(_FUNCTION_END):
            return ToolCallParseError(
                "invalid_xml", f"<function={name}> is not closed by </function>", raw=body
            )
        arguments = self._parse_parameters(
            stripped[head.end() : -len(_FUNCTION_END)], _properties(tools, name)
        )
        if isinstance(arguments, str):
            return ToolCallParseError("invalid_xml", arguments, raw=body)
        if isinstance(arguments, ToolCallParseError):
            return ToolCallParseError(arguments.kind, arguments.reason, raw=body)
        return ToolCall(name=name, arguments=arguments)

    @staticmethod
    def _parse_parameters(
        inner: str, properties: Mapping[str, Any]
    ) -> dict[str, Any] | str | ToolCallParseError:
        arguments: dict[str, Any] = {}
        pos = 0
        while True:
            while pos < len(inner) and inner[pos].isspace():
                pos += 1
            if pos == len(inner):
                return arguments
            if not inner.startswith(_PARAMETER, pos):
                return f"unexpected text {inner[pos : pos + 40]!r} inside <function=...>"
            close = inner.find(">", pos)
            if close == -1:
                return "<parameter= is not closed by >"
            key = inner[pos + len(_PARAMETER) : close].strip()
            if not key:
                return ToolCallParseError("invalid_arguments", "<parameter=> has no name")
            end = inner.find(_PARAMETER_END, close)
            if end == -1:
                return f"<parameter={key}> is not closed by </parameter>"
            if key in arguments:
                return ToolCallParseError("invalid_arguments", f"argument {key!r} given twice")
            value = inner[close + 1 : end]
            # The template puts the value on its own lines: one newline on each side belongs to the markup.
            value = value.removeprefix("\n").removesuffix("\n")
            schema = properties.get(key)
            arguments[key] = convert_argument(value, schema if isinstance(schema, Mapping) else None)
            pos = end + len(_PARAMETER_END)
