"""Argument aliases and JSON-schema validation."""

from __future__ import annotations

from mcprl_tools.validation import ArgumentChecker

SCHEMA = {
    "type": "object",
    "properties": {"code": {"type": "string"}, "timeout": {"type": "integer", "minimum": 1}},
    "required": ["code"],
    "additionalProperties": False,
}


def test_alias_is_renamed_to_the_canonical_key() -> None:
    checker = ArgumentChecker(SCHEMA, {"python_code": "code", "source": "code"})
    assert checker.normalise({"python_code": "x"}) == {"code": "x"}
    assert checker.error(checker.normalise({"source": "y"})) is None


def test_alias_for_a_key_the_tool_does_not_have_is_ignored() -> None:
    checker = ArgumentChecker(SCHEMA, {"q": "query"})
    assert checker.normalise({"q": 1}) == {"q": 1}
    assert (
        checker.error({"q": 1, "code": "x"}) == "Additional properties are not allowed ('q' was unexpected)"
    )


def test_errors_say_what_and_where() -> None:
    checker = ArgumentChecker(SCHEMA, {})
    assert checker.error({"code": "x", "timeout": 0}) == "0 is less than the minimum of 1 at 'timeout'"
    assert checker.error({}) == "'code' is a required property"


def test_schema_dialect_follows_dollar_schema() -> None:
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "type": "object",
        "properties": {"n": {"type": "number", "maximum": 5, "exclusiveMaximum": True}},
    }
    checker = ArgumentChecker(draft4, {})
    assert checker.error({"n": 4}) is None
    assert checker.error({"n": 5}) is not None  # draft-04 boolean exclusiveMaximum


def test_a_broken_schema_leaves_validation_to_the_server() -> None:
    checker = ArgumentChecker({"type": "not-a-type"}, {})
    assert checker.error({"anything": 1}) is None


def test_huge_invalid_arguments_give_a_bounded_message() -> None:
    checker = ArgumentChecker({"type": "object", "properties": {"n": {"type": "integer"}}}, {})
    message = checker.error({"n": "x" * 10_000_000})
    assert message is not None
    assert len(message) < 600
