"""Tool arguments: what the transport can carry, alias normalisation and JSON-schema validation."""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators

_MAX_MESSAGE = 400
_FLOAT_MAX = sys.float_info.max
MAX_ARGUMENT_DEPTH = 64
"""Deepest nesting of a call's arguments; past it the call is the model's fault, not the serialiser's."""


class ArgumentChecker:
    """Normalises aliases and validates arguments against one tool's input schema.

    The validator class follows the schema's `$schema` (Draft 2020-12 when absent). A schema the validator
    itself rejects disables validation for that tool (the server remains the judge) instead of failing calls.
    """

    def __init__(self, schema: Mapping[str, Any], aliases: Mapping[str, str]) -> None:
        schema = dict(schema)
        cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
        try:
            cls.check_schema(schema)
            self._validator: jsonschema.protocols.Validator | None = cls(schema)
        except jsonschema.exceptions.SchemaError:
            self._validator = None
        props = schema.get("properties")
        known = set(props) if isinstance(props, Mapping) else set()
        # An alias applies only when the tool knows the canonical name and not the alias itself.
        self._aliases = {a: c for a, c in aliases.items() if c in known and a not in known}

    def normalise(self, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """Rename aliased keys to their canonical names (never overwriting a canonical key given too)."""
        if not self._aliases:
            return dict(arguments)
        out: dict[str, Any] = {}
        for key, value in arguments.items():
            canonical = self._aliases.get(key)
            if canonical is not None and canonical not in arguments:
                out[canonical] = value
            else:
                out[key] = value
        return out

    def error(self, arguments: Mapping[str, Any]) -> str | None:
        """A message for the model describing why `arguments` are invalid, or None when they are valid."""
        if self._validator is None:
            return None
        best = jsonschema.exceptions.best_match(self._validator.iter_errors(arguments))
        if best is None:
            return None
        where = "/".join(str(p) for p in best.absolute_path)
        location = f" at '{where}'" if where else ""
        message = best.message if len(best.message) <= _MAX_MESSAGE else best.message[:_MAX_MESSAGE] + "…"
        return f"{message}{location}"


def transport_problem(arguments: Mapping[str, Any], *, max_bytes: int) -> str | None:
    """Why `arguments` cannot travel to a server intact, or None when they can.

    JSON (RFC 8259) carries Unicode scalar values, finite numbers and string keys; the SDK's serialiser
    raises on a lone surrogate, silently turns NaN and infinities into `null`, and a peer that reads
    numbers as IEEE doubles cannot hold an integer past their range (RFC 8259 §6). NUL is JSON-clean but
    ends a C string in whatever the server hands it to. Nesting and size are bounded so one call cannot
    exhaust the serialiser's recursion or a server's memory.

    Args:
        arguments: Decoded tool arguments.
        max_bytes: Largest UTF-8 JSON encoding accepted.
    """
    left = max_bytes
    stack: list[tuple[object, int, str]] = [(arguments, 0, "")]
    while stack:
        value, depth, where = stack.pop()
        at = f" at '{where[:80]}'" if where else ""
        if depth > MAX_ARGUMENT_DEPTH:
            return f"arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels{at}"
        match value:
            case bool() | None:
                left -= 5
            case int():
                if abs(value) > _FLOAT_MAX:
                    return f"integer{at} is outside the range a JSON number can carry (about ±1.8e308)"
                left -= 24
            case float():
                if not math.isfinite(value):
                    return f"{value!r}{at} is not a JSON number (NaN and infinities cannot be sent)"
                left -= 24
            case str():
                size, problem = _encoded_string(value)
                if problem is not None:
                    return f"string{at} {problem}"
                left -= size + 2
            case Mapping():
                for key, item in value.items():  # pyright: ignore[reportUnknownVariableType]
                    if not isinstance(key, str):
                        return f"object key {key!r}{at} is not a string"
                    size, problem = _encoded_string(key)
                    if problem is not None:
                        return f"object key{at} {problem}"
                    left -= size + 4
                    stack.append((item, depth + 1, f"{where}/{key}" if where else key))
            case list() | tuple():
                for i, item in enumerate(value):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
                    stack.append((item, depth + 1, f"{where}/{i}" if where else str(i)))
            case _:
                return f"{type(value).__name__} value{at} is not JSON"
        if left < 0:
            return f"arguments are larger than {max_bytes} bytes"
    return None


def _encoded_string(text: str) -> tuple[int, str | None]:
    """UTF-8 size of `text`, and why it cannot be sent (None when it can)."""
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        where = f"{text[exc.start]!r} at index {exc.start}"
        return 0, f"holds a lone surrogate ({where}), which UTF-8 cannot encode"
    if "\x00" in text:
        return size, f"holds a NUL character (at index {text.index(chr(0))})"
    return size, None
