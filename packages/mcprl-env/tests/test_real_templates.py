"""Every covered family against the vendor's own chat template: parse(render(call)) == call, and auto-detection.

The templates come from scripts/fetch-chat-templates.py (cached; the tests skip with the reason when they
cannot be fetched). Rendering goes through transformers' ``apply_chat_template`` (skipped without it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from real_templates import SINGLE_CALL, TEMPLATE_FAMILIES, tokenizer_with_template

from mcprl_env import (
    EnvConfig,
    Environment,
    ToolCall,
    UnknownToolCallFormatError,
    detect_parser_family,
    get_parser,
)
from mcprl_env.parsing import render_assistant_turn

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TEMPLATES = sorted(TEMPLATE_FAMILIES)

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "search_notes",
            "description": "Search notes.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string"},
                    "limit": {"type": "integer"},
                    "min_score": {"type": "number"},
                    "exact": {"type": "boolean"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                    "filters": {"type": "object"},
                },
                "required": ["query"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    },
]

CALLS: list[list[ToolCall]] = [
    [ToolCall(name="multiply", arguments={"a": 3, "b": 4.5})],
    [
        ToolCall(
            name="search_notes",
            arguments={
                "query": 'ünï "quoted" <b>bold</b>\nsecond line',
                "limit": 10,
                "min_score": 0.25,
                "exact": True,
                "tags": ["a", "b c"],
                "filters": {"year": 2024, "nested": {"ok": False}},
            },
        )
    ],
    [ToolCall(name="search_notes", arguments={"query": "42", "exact": False})],
    [
        ToolCall(name="multiply", arguments={"a": -1, "b": 1e-05}),
        ToolCall(name="search_notes", arguments={"query": "null"}),
    ],
]


@pytest.fixture(scope="module")
def templates(chat_templates_dir: Path) -> dict[str, str]:
    missing = [name for name in TEMPLATES if not (chat_templates_dir / name).is_file()]
    assert not missing, f"templates not in {chat_templates_dir}: {missing}"
    return {name: (chat_templates_dir / name).read_text() for name in TEMPLATES}


def _message(calls: list[ToolCall], content: str = "") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [
            {"type": "function", "function": {"name": c.name, "arguments": dict(c.arguments)}} for c in calls
        ],
    }


def _round_trip(template: str, family: str, calls: list[ToolCall], content: str = "") -> None:
    tok = tokenizer_with_template(template)
    messages = [{"role": "user", "content": "Find my notes."}, _message(calls, content)]
    turn = render_assistant_turn(tok, messages, tools=TOOLS)
    parsed = get_parser(family).parse(turn, tools=TOOLS)
    assert parsed.errors == [], turn
    assert parsed.calls == calls, turn
    assert not parsed.is_final


@pytest.mark.parametrize("name", TEMPLATES)
def test_the_family_is_recognised_from_what_the_template_renders(
    templates: dict[str, str], name: str
) -> None:
    assert detect_parser_family(tokenizer_with_template(templates[name])) == TEMPLATE_FAMILIES[name]


@pytest.mark.parametrize("name", TEMPLATES)
@pytest.mark.parametrize("case", range(len(CALLS)))
def test_parse_of_the_rendered_calls_gives_back_the_calls(
    templates: dict[str, str], name: str, case: int
) -> None:
    calls = CALLS[case]
    if len(calls) > 1 and name in SINGLE_CALL:
        pytest.skip("the template renders one call per assistant message")
    _round_trip(templates[name], TEMPLATE_FAMILIES[name], calls)


@pytest.mark.parametrize("name", TEMPLATES)
def test_text_before_the_calls_stays_out_of_them(templates: dict[str, str], name: str) -> None:
    _round_trip(templates[name], TEMPLATE_FAMILIES[name], CALLS[0], content="Let me multiply.")


@pytest.mark.parametrize("name", ["Qwen-Qwen3-0.6B.jinja", "Qwen3.5-4B.jinja"])
@pytest.mark.parametrize("enable_thinking", [True, False])
def test_thinking_switches_do_not_change_the_family(
    templates: dict[str, str], name: str, enable_thinking: bool
) -> None:
    tok = tokenizer_with_template(templates[name])
    family = detect_parser_family(tok, template_kwargs={"enable_thinking": enable_thinking})
    assert family == TEMPLATE_FAMILIES[name]


_text = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="<"), max_size=30)
_search_args = st.fixed_dictionaries(
    {"query": _text},
    optional={
        "limit": st.integers(-(10**12), 10**12),
        "min_score": st.floats(allow_nan=False, allow_infinity=False, width=64),
        "exact": st.booleans(),
        "tags": st.lists(_text, max_size=3),
        "filters": st.dictionaries(
            st.text("abcxyz_", min_size=1, max_size=5), st.integers() | _text, max_size=3
        ),
    },
)


@pytest.mark.parametrize("name", TEMPLATES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arguments=_search_args)
def test_any_schema_valid_arguments_round_trip(
    templates: dict[str, str], name: str, arguments: dict[str, Any]
) -> None:
    if TEMPLATE_FAMILIES[name] == "qwen3_coder" and (arguments["query"].strip() != arguments["query"]):
        # The XML value sits on its own lines; whitespace at a string's edges is not recoverable exactly.
        arguments = {**arguments, "query": arguments["query"].strip() or "q"}
    _round_trip(
        templates[name], TEMPLATE_FAMILIES[name], [ToolCall(name="search_notes", arguments=arguments)]
    )


def test_a_template_without_tool_calls_is_an_error_naming_env_parser(chat_templates_dir: Path) -> None:
    tok = tokenizer_with_template((chat_templates_dir / "google-gemma-2-2b-it.jinja").read_text())
    with pytest.raises(UnknownToolCallFormatError, match=r"does not render tool calls.*env\.parser"):
        detect_parser_family(tok)


def test_an_unknown_call_format_is_an_error_naming_env_parser(chat_templates_dir: Path) -> None:
    tok = tokenizer_with_template((chat_templates_dir / "openai-gpt-oss-120b.jinja").read_text())
    with pytest.raises(UnknownToolCallFormatError, match=r"no registered parser.*env\.parser"):
        Environment(manager=None, tokenizer=tok, config=EnvConfig())  # type: ignore[arg-type]


def test_env_parser_overrides_detection(chat_templates_dir: Path) -> None:
    tok = tokenizer_with_template((chat_templates_dir / "openai-gpt-oss-120b.jinja").read_text())
    env = Environment(manager=None, tokenizer=tok, config=EnvConfig(parser="hermes"))  # type: ignore[arg-type]
    assert type(env.parser).__name__ == "HermesToolCallParser"
