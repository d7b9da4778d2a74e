"""Qwen3.5/Qwen3-Coder XML and Llama 3 JSON parsers: typed errors for malformed calls, schema-typed values."""

from __future__ import annotations

from typing import Any

import pytest

from mcprl_env import (
    ConfigError,
    EnvConfig,
    Llama3JsonToolCallParser,
    QwenXmlToolCallParser,
    ToolCall,
    UnknownToolCallFormatError,
    detect_parser_family,
    get_parser,
    parser_families,
)
from mcprl_env.parsing import convert_argument
from mcprl_env.testing import CharTokenizer

xml = QwenXmlToolCallParser().parse
llama = Llama3JsonToolCallParser().parse

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {
                    "s": {"type": "string"},
                    "n": {"type": "integer"},
                    "x": {"type": "number"},
                    "b": {"type": "boolean"},
                    "o": {"type": "object"},
                    "l": {"type": "array"},
                    "maybe": {"type": ["integer", "null"]},
                    "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
                },
            },
        },
    }
]


def xml_call(name: str, **params: str) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"<tool_call>\n<function={name}>\n{body}</function>\n</tool_call>"


def test_xml_values_take_the_types_the_schema_gives() -> None:
    turn = xml(
        xml_call("f", s="3", n="7", x="2.5", b="True", o='{"k": [1]}', l="[1, 2]", maybe="null", either="12"),
        tools=TOOLS,
    )
    assert turn.errors == []
    assert turn.calls == [
        ToolCall(
            name="f",
            arguments={
                "s": "3",
                "n": 7,
                "x": 2.5,
                "b": True,
                "o": {"k": [1]},
                "l": [1, 2],
                "maybe": None,
                "either": "12",  # a type that allows strings keeps the text
            },
        )
    ]


def test_xml_values_without_a_schema_or_that_do_not_convert_stay_text() -> None:
    turn = xml(xml_call("f", n="seven", unknown="5", b="yes") + xml_call("g", k="1"), tools=TOOLS)
    assert [c.arguments for c in turn.calls] == [{"n": "seven", "unknown": "5", "b": "yes"}, {"k": "1"}]
    assert convert_argument("2.0", {"type": "integer"}) == "2.0"
    assert convert_argument("true", {"type": "integer"}) == "true"


def test_xml_multiline_values_keep_their_inner_newlines() -> None:
    turn = xml(xml_call("f", s="line one\n\nline two\n"), tools=TOOLS)
    assert turn.calls[0].arguments == {"s": "line one\n\nline two\n"}


def test_xml_text_and_thinking_around_calls() -> None:
    turn = xml("<think>plan</think>I will call.\n\n" + xml_call("f", s="a") + "\n" + xml_call("f", s="b"))
    assert [c.arguments["s"] for c in turn.calls] == ["a", "b"]
    assert turn.content == "I will call."
    assert turn.thinking == "plan"
    assert turn.answer is None


def test_xml_turn_without_calls_is_final() -> None:
    turn = xml("\n</think>\n\nThe answer is <answer>42</answer>")
    assert turn.is_final
    assert turn.answer == "42"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>', "invalid_xml"),
        ("<tool_call>\n<function=f>\n<parameter=s>\nx\n</parameter>\n</tool_call>", "invalid_xml"),
        ("<tool_call>\n<function=f>\n<parameter=s>\nx\n</function>\n</tool_call>", "invalid_xml"),
        ("<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>", "invalid_xml"),
        ("<tool_call>\n<function=>\n</function>\n</tool_call>", "invalid_name"),
        (
            "<tool_call>\n<function=f>\n<parameter=>\nx\n</parameter>\n</function>\n</tool_call>",
            "invalid_arguments",
        ),
        (
            xml_call("f", s="a").replace("</function>", "<parameter=s>\nb\n</parameter>\n</function>"),
            "invalid_arguments",
        ),
        ("<tool_call>\n<function=f>\n</function>\n", "unclosed_tag"),
        ("<tool_call>  </tool_call>", "empty_call"),
        ("<function=f>\n<parameter=s>\nx\n</parameter>\n</function>", "unopened_tag"),
    ],
)
def test_xml_malformed_calls_are_typed_errors(text: str, kind: str) -> None:
    turn = xml(text, tools=TOOLS)
    assert [e.kind for e in turn.errors] == [kind]
    assert not turn.is_final


def test_xml_too_large_call_is_an_error() -> None:
    turn = QwenXmlToolCallParser(max_call_chars=50).parse(xml_call("f", s="x" * 100))
    assert [e.kind for e in turn.errors] == ["too_large"]


@pytest.mark.parametrize("prefix", ["", "<|python_tag|>", "  \n"])
def test_llama_json_call_with_or_without_python_tag(prefix: str) -> None:
    turn = llama(prefix + '{"name": "f", "parameters": {"n": 1}}')
    assert turn.calls == [ToolCall(name="f", arguments={"n": 1})]
    assert turn.errors == []


def test_llama_semicolon_separated_calls_and_arguments_key() -> None:
    turn = llama('{"name": "f", "parameters": {}}; {"name": "g", "arguments": {"a": [1]}};')
    assert turn.calls == [ToolCall(name="f", arguments={}), ToolCall(name="g", arguments={"a": [1]})]


def test_llama_text_before_the_python_tag_is_content() -> None:
    turn = llama('Checking.<|python_tag|>{"name": "f", "parameters": {}}')
    assert turn.content == "Checking."
    assert len(turn.calls) == 1


def test_llama_prose_is_a_final_answer() -> None:
    turn = llama("The product is 13.5. {not a call}")
    assert turn.is_final
    assert turn.answer == "The product is 13.5. {not a call}"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('{"name": "f", "parameters": {}', "invalid_json"),
        ('{"name": "f", "parameters": {}} and more', "invalid_json"),
        ('{"parameters": {}}', "missing_name"),
        ('{"name": "f", "parameters": [1]}', "invalid_arguments"),
        ('{"name": "f", "parameters": {}, "id": 3}', "unexpected_keys"),
        ("<|python_tag|>", "empty_call"),
        ("<|python_tag|>[1, 2]", "not_an_object"),
    ],
)
def test_llama_malformed_calls_are_typed_errors(text: str, kind: str) -> None:
    turn = llama(text)
    assert [e.kind for e in turn.errors] == [kind]
    assert not turn.is_final


def test_families_and_aliases() -> None:
    assert isinstance(get_parser("Qwen3.5"), QwenXmlToolCallParser)
    assert isinstance(get_parser("qwen3-coder"), QwenXmlToolCallParser)
    assert isinstance(get_parser("llama3.2"), Llama3JsonToolCallParser)
    assert {"hermes", "qwen3_coder", "llama3_json"} <= set(parser_families())
    with pytest.raises(KeyError, match="resolve_parser"):
        get_parser("auto")


def test_env_parser_is_checked_with_a_suggestion() -> None:
    assert EnvConfig().parser == "auto"
    assert EnvConfig(parser="llama3").parser == "llama3"
    with pytest.raises(ConfigError, match="did you mean 'llama3'"):
        EnvConfig(parser="lama3")


def test_the_test_tokenizer_is_recognised_as_hermes() -> None:
    assert detect_parser_family(CharTokenizer()) == "hermes"


class _NoToolsTokenizer(CharTokenizer):
    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any:
        return super().apply_chat_template([m for m in conversation if "tool_calls" not in m], **kwargs)


def test_a_tokenizer_that_drops_calls_is_an_error_naming_env_parser() -> None:
    with pytest.raises(UnknownToolCallFormatError, match=r"env\.parser"):
        detect_parser_family(_NoToolsTokenizer())
