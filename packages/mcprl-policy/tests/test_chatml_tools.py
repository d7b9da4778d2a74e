"""The shipped ChatML tool template renders as Qwen2.5-Instruct's does, with the model's own system prompt.

Rendering is what these tests are about, so the tokenizer is the embedded tiny model's with its template
replaced (transformers' ``apply_chat_template`` renders the same text on any tokenizer); the published
Qwen2.5 template comes from the vendors' templates the root conftest fetches.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest
from transformers import AutoTokenizer

from mcprl_policy import chatml_tool_template
from mcprl_policy.chatml_tools import DEFAULT_SYSTEM_PROMPT

QWEN_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_quote",
            "description": "Latest price of a ticker.",
            "parameters": {
                "type": "object",
                "properties": {"symbol": {"type": "string"}},
                "required": ["symbol"],
            },
        },
    }
]


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CONVERSATION: list[dict[str, Any]] = [
    {"role": "user", "content": "Prices of ACME and BETA?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("get_quote", symbol="ACME")]},
    {"role": "tool", "name": "get_quote", "content": '{"price": 12.5}'},
    {
        "role": "assistant",
        "content": "Now BETA.",
        "tool_calls": [_call("get_quote", symbol="BETA"), _call("get_quote", symbol="GAMMA")],
    },
    {"role": "tool", "name": "get_quote", "content": '{"price": 3}'},
    {"role": "tool", "name": "get_quote", "content": '{"price": 4}'},
    {"role": "assistant", "content": "<answer>12.5, 3</answer>"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> Any:
    return cast(Any, AutoTokenizer.from_pretrained(tiny_dir))  # pyright: ignore[reportUnknownMemberType]


def _render(tok: Any, template: str, messages: list[dict[str, Any]], **kwargs: Any) -> str:
    tok.chat_template = template
    return tok.apply_chat_template(messages, tokenize=False, **kwargs)


@pytest.mark.parametrize("tools", [TOOLS, None], ids=["tools", "no-tools"])
@pytest.mark.parametrize("system", [True, False], ids=["system", "no-system"])
def test_it_renders_what_qwen25s_template_renders_but_the_default_system_prompt(
    chat_templates_dir: Path, tokenizer: Any, tools: list[dict[str, Any]] | None, system: bool
) -> None:
    qwen = (chat_templates_dir / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    messages = [{"role": "system", "content": "Use the tools."}, *CONVERSATION] if system else CONVERSATION
    for prompt in (True, False):
        ours = _render(tokenizer, chatml_tool_template(), messages, tools=tools, add_generation_prompt=prompt)
        theirs = _render(tokenizer, qwen, messages, tools=tools, add_generation_prompt=prompt)
        assert ours == theirs.replace(QWEN_SYSTEM, DEFAULT_SYSTEM_PROMPT)
        assert (DEFAULT_SYSTEM_PROMPT in ours) is not system


def test_tools_calls_and_results_render_in_the_hermes_format(tokenizer: Any) -> None:
    text = _render(tokenizer, chatml_tool_template(), CONVERSATION, tools=TOOLS)
    schemas = text.split("<tools>\n", 1)[1].split("\n</tools>", 1)[0]
    assert [json.loads(line) for line in schemas.splitlines()] == TOOLS
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_quote", "arguments": {"symbol": "ACME"}}\n</tool_call>'
        in text
    )
    assert "<|im_start|>assistant\nNow BETA.\n<tool_call>\n" in text
    assert '<|im_start|>user\n<tool_response>\n{"price": 3}\n</tool_response>\n<tool_response>\n' in text
    assert text.endswith("<|im_start|>assistant\n<answer>12.5, 3</answer><|im_end|>\n")


def test_arguments_given_as_a_json_string_are_written_once(tokenizer: Any) -> None:
    as_string = [
        CONVERSATION[0],
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"type": "function", "function": {"name": "get_quote", "arguments": '{"symbol": "ACME"}'}}
            ],
        },
    ]
    assert _render(tokenizer, chatml_tool_template(), as_string, tools=TOOLS) == _render(
        tokenizer, chatml_tool_template(), CONVERSATION[:2], tools=TOOLS
    )


def test_the_default_system_prompt_is_the_models_own_even_with_quotes(tokenizer: Any) -> None:
    own = 'You are "Smol", naïve \\ helpful.'
    text = _render(tokenizer, chatml_tool_template(own), CONVERSATION[:1], add_generation_prompt=True)
    assert (
        text
        == f"<|im_start|>system\n{own}<|im_end|>\n<|im_start|>user\nPrices of ACME and BETA?<|im_end|>\n<|im_start|>assistant\n"
    )
