"""Argument alias normalisation and JSON-schema validation of tool arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import jsonschema.validators

_MAX_MESSAGE = 400


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
