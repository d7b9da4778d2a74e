"""SmolLM2-135M-Instruct (``smollm2-135m``) with the ChatML tool template it is saved with, through mcprl's stack.

Its vocabulary has no ``<tool_call>`` token: the tags are ordinary text tokens. On its real tokenizer: doctor's
model checks pass and recognise the ``hermes`` parser; the parser reads calls from the text of sampled ids; an
episode (a scripted sampler writing what the model writes, ending each turn with ``<|im_end|>``, against a real
in-memory MCP server) is token for token its sampled ids and what the template renders after each turn; a
structured demonstration of the same conversation is the same ids; plan's shape is the converted config's.
The model is fetched once per machine (`mcprl_policy.pinned_models`); the tests skip, with the reason, where it
cannot be.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import anyio
import pytest
from mcp.server.mcpserver import MCPServer
from transformers import AutoTokenizer

from mcprl_env import EnvConfig, Environment, Episode, ToolCall, get_parser, task_from_dict
from mcprl_env.testing import ScriptedSampler
from mcprl_tools import ToolManager
from mcprl_train.commands.plan import ModelShape, load_model_shape
from mcprl_train.config import Config
from mcprl_train.loop.warm_start import render_example
from mcprl_train.model_checks import check_model


def hermes(name: str, **arguments: Any) -> str:
    """A call as the template renders it, and as a model trained on it writes it."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


SCRIPT = [hermes("multiply", a=3, b=4.5), hermes("divide", a=27, b=2), "<answer>13.5</answer>"]


@pytest.fixture(scope="module")
def tok(smollm2_dir: Path) -> Any:
    return cast(Any, AutoTokenizer.from_pretrained(smollm2_dir))  # pyright: ignore[reportUnknownMemberType]


def _calc() -> MCPServer:
    server = MCPServer("calc")

    @server.tool(description="Multiply two numbers.")
    def multiply(a: float, b: float) -> str:
        return f"{a * b:g}"

    @server.tool(description="Divide a by b.")
    def divide(a: float, b: float) -> str:
        return f"{a / b:g}"

    return server


def _task() -> Any:
    return task_from_dict(
        {
            "id": "mul-1",
            "prompt": "What is 3 times 4.5?",
            "servers": ["calc"],
            "difficulty": "easy",
            "answer": "13.5",
            "checker": {"type": "numeric", "rel_tol": 1e-6, "abs_tol": 0.005},
        }
    )


async def _episode(tok: Any) -> tuple[Episode, list[dict[str, Any]]]:
    async with ToolManager.in_memory({"calc": _calc()}, call_timeout=5) as manager:
        env = Environment(manager=manager, tokenizer=tok, config=EnvConfig())
        with anyio.fail_after(60):
            episode = await env.run_episode(_task(), ScriptedSampler(tok, SCRIPT))
        return episode, list(env.tool_access(_task()).schemas)


def test_doctors_model_checks_pass_and_recognise_hermes(smollm2_dir: Path) -> None:
    checks = check_model(Config.from_dict({"model": {"name": "smollm2-135m"}}))
    assert [(c.name, c.ok) for c in checks] == [
        ("tokenizer", True),
        ("template", True),
        ("parser", True),
        ("vocabulary", True),
    ]
    assert checks[2].detail == "env.parser=auto: recognised 'hermes'"


def test_the_tool_tags_are_ordinary_text_tokens_that_the_hermes_parser_reads(tok: Any) -> None:
    for tag in ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"):
        assert len(tok.encode(tag, add_special_tokens=False)) > 1, tag
    ids = [*tok.encode(SCRIPT[0], add_special_tokens=False), tok.eos_token_id]
    text = tok.decode(ids, skip_special_tokens=True)  # what the sampler returns as the turn's text
    assert text == SCRIPT[0]
    tools = [{"type": "function", "function": {"name": "multiply", "parameters": {}}}]
    parsed = get_parser("hermes").parse(text, tools=tools)
    assert not parsed.errors
    assert parsed.calls == [ToolCall(name="multiply", arguments={"a": 3, "b": 4.5})]


def test_an_episode_is_its_sampled_ids_and_what_the_template_renders_after_each_im_end(tok: Any) -> None:
    ep, tools = anyio.run(_episode, tok)
    assert (ep.valid, ep.stop_reason, ep.success, ep.error) == (True, "answer", True, None)
    assert (ep.metrics["template_drift"], ep.metrics["parse_errors"], ep.metrics["turns"]) == (0.0, 0.0, 3)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.eos_token_id == eos
    turns = [k for k, m in enumerate(ep.messages) if m["role"] == "assistant"]
    prompt = tok.apply_chat_template(ep.messages[:1], tools=tools, tokenize=False, add_generation_prompt=True)
    expected: list[int] = tok.encode(prompt, add_special_tokens=False)
    mask = [0] * len(expected)
    for n, text in enumerate(SCRIPT):
        sampled = [*tok.encode(text, add_special_tokens=False), eos]
        expected += sampled
        mask += [1] * len(sampled)
        if n + 1 < len(turns):
            before = ep.messages[: turns[n + 1]]
            plain = tok.apply_chat_template(before, tools=tools, tokenize=False)
            prompted = tok.apply_chat_template(
                before, tools=tools, tokenize=False, add_generation_prompt=True
            )
            end = plain.index("<|im_end|>", plain.rindex("<|im_start|>assistant")) + len("<|im_end|>")
            after = plain[end:] + prompted[len(plain) :]
            suffix = tok.encode(after, add_special_tokens=False)
            expected += suffix
            mask += [0] * len(suffix)
    assert ep.token_ids == expected
    assert ep.loss_mask == mask
    rendered = tok.apply_chat_template(ep.messages, tools=tools, tokenize=False)
    assert tok.decode(ep.token_ids) == rendered[:-1]  # the template's newline after the last <|im_end|>


def test_a_structured_demonstration_is_the_episode_token_for_token(tok: Any) -> None:
    ep, tools = anyio.run(_episode, tok)
    structured: list[dict[str, Any]] = []
    for message in ep.messages:
        parsed = get_parser("hermes").parse(message["content"], tools=tools)
        if message["role"] == "assistant" and parsed.calls:
            calls = [
                {"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for c in parsed.calls
            ]
            structured.append({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            structured.append({"role": message["role"], "content": message["content"]})
    example = render_example(tok, structured, tools)
    n = len(ep.token_ids)
    assert example.token_ids[:n] == ep.token_ids
    assert example.assistant_mask[:n] == ep.loss_mask
    assert example.token_ids[n:] == tok.encode("\n", add_special_tokens=False)  # after the last <|im_end|>
    assert not any(example.assistant_mask[n:])


def test_plans_table_row_is_the_converted_models_config(smollm2_dir: Path) -> None:
    from transformers import AutoConfig

    config = cast(Any, AutoConfig.from_pretrained(smollm2_dir))  # pyright: ignore[reportUnknownMemberType]
    converted = ModelShape.from_hf_config(config, source="converted")
    row = load_model_shape("smollm2-135m")
    assert converted.num_params == row.num_params
    for field in (
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_layers",
        "num_heads",
        "num_kv_heads",
    ):
        assert getattr(converted, field) == getattr(row, field), field
    assert (converted.head_dim, converted.tie_embeddings) == (row.head_dim, row.tie_embeddings)
