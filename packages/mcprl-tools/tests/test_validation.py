"""What the transport can carry, argument aliases and JSON-schema validation."""

from __future__ import annotations

import json
import sys

import pytest

from mcprl_tools.validation import MAX_ARGUMENT_DEPTH, ArgumentChecker, transport_problem

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


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"text": "a\ud800b"}, "string at 'text' holds a lone surrogate ('\\ud800' at index 1)"),
        ({"\udfff": 1}, "object key holds a lone surrogate ('\\udfff' at index 0)"),
        ({"a": {"b": ["ok", "\x00"]}}, "string at 'a/b/1' holds a NUL character (at index 0)"),
        ({"n": float("nan")}, "nan at 'n' is not a JSON number"),
        ({"n": [float("-inf")]}, "-inf at 'n/0' is not a JSON number"),
        ({"n": 10**309}, "integer at 'n' is outside the range a JSON number can carry"),
        ({"n": -(10**5000)}, "integer at 'n' is outside the range a JSON number can carry"),
        ({"x": b"bytes"}, "bytes value at 'x' is not JSON"),
        ({"x": {1: "a"}}, "object key 1 at 'x' is not a string"),
        ({"s": "x" * 2000}, "arguments are larger than 1024 bytes"),
        ({"s": "é" * 600}, "arguments are larger than 1024 bytes"),
    ],
)
def test_what_the_transport_cannot_carry_is_named(arguments: dict[str, object], expected: str) -> None:
    problem = transport_problem(arguments, max_bytes=1024)
    assert problem is not None
    assert problem.startswith(expected)


def test_nesting_past_the_limit_is_rejected_and_at_the_limit_accepted() -> None:
    def nest(depth: int) -> object:
        value: object = 1
        for _ in range(depth):
            value = [value]
        return value

    assert transport_problem({"a": nest(MAX_ARGUMENT_DEPTH - 1)}, max_bytes=1 << 20) is None
    deep = transport_problem({"a": nest(MAX_ARGUMENT_DEPTH)}, max_bytes=1 << 20)
    assert deep is not None
    assert deep.startswith(f"arguments nest deeper than {MAX_ARGUMENT_DEPTH} levels")
    # 100,000 levels: the walk is iterative, so no RecursionError on the way to the answer.
    assert transport_problem({"a": nest(100_000)}, max_bytes=1 << 30) is not None


def test_everything_json_carries_passes() -> None:
    arguments = {
        "text": "emoji 🎉, CJK 漢字, controls \x01\x1f\t\n, quotes \" ' </tool_call>",
        "n": [0, -1, 2**63, int(sys.float_info.max), 1e308, -0.0, True, None],
        "nested": {"k": {"k": [{}]}},
    }
    assert transport_problem(arguments, max_bytes=1 << 20) is None
    encoded = json.dumps(arguments, ensure_ascii=False).encode()
    assert transport_problem(arguments, max_bytes=len(encoded)) is None
