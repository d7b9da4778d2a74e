"""Demonstrations are structured chat messages that the model's own chat template renders in its own format.

Against the vendors' published templates (fetched by the conftest): a structured demonstration is token for
token the episode the model produces when it writes its calls in its family's format, and every target turn
of the bundled scripted demonstrations parses, with the family's parser, back into the structured calls.
Against the embedded tiny model's template: structured calls render exactly as the text form its warm start
used before, so its training data is unchanged.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

import mcprl_tasks
import mcprl_tasks.toolsim
from mcprl_env import ChatTokenizer, Transcript, get_parser
from mcprl_env.testing import ScriptedCompletion
from mcprl_policy.tiny import build_tiny_model
from mcprl_train.errors import DemonstrationError
from mcprl_train.loop.warm_start import SFTExample, render_example

TemplateTokenizer = Callable[
    [str, str, str], Any
]  # the conftest fixture: (template, eos, sample) -> tokenizer

_STRINGS = ("symbol", "expression", "query", "doc_id", "channel", "text", "code")
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name} tool",
            "parameters": {
                "type": "object",
                "properties": {
                    **{arg: {"type": "string"} for arg in _STRINGS},
                    **{arg: {"type": "integer"} for arg in ("limit", "k")},
                },
            },
        },
    }
    for name in sorted({*mcprl_tasks.toolsim.SIMULATED_TOOLS, "run_python"})
]  # the scripts' tools and argument types (Qwen3.5's XML arguments are typed by the schema)


def _call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


STRUCTURED: list[dict[str, Any]] = [
    {"role": "system", "content": "You answer with tools."},
    {"role": "user", "content": "Price of ACME times 3?"},
    {"role": "assistant", "content": "", "tool_calls": [_call("get_quote", symbol="ACME")]},
    {"role": "tool", "name": "get_quote", "content": '{"symbol": "ACME", "price": 12.5}'},
    {"role": "assistant", "content": "", "tool_calls": [_call("calculate", expression="3 * 12.5")]},
    {"role": "tool", "name": "calculate", "content": "37.5"},
    {"role": "assistant", "content": "<answer>37.5</answer>"},
]


def _hermes(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def _xml(name: str, **arguments: Any) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def _llama(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "parameters": arguments})


def _as_written(fmt: Callable[..., str], prefix: str = "") -> list[str]:
    """The three assistant turns of `STRUCTURED` as the model family writes them."""
    return [
        prefix + fmt("get_quote", symbol="ACME"),
        prefix + fmt("calculate", expression="3 * 12.5"),
        prefix + "<answer>37.5</answer>",
    ]


# name → (template file, end-of-turn token, template kwargs, parser family, the turns as the model writes them)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], str, list[str]]] = {
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>", {}, "hermes", _as_written(_hermes)),
    "qwen3-thinking-off": (
        "Qwen-Qwen3-0.6B.jinja",
        "<|im_end|>",
        {"enable_thinking": False},
        "hermes",
        _as_written(_hermes),
    ),
    # Qwen3.5's generation prompt opens the think block; a turn without reasoning closes it empty.
    "qwen3.5": ("Qwen3.5-4B.jinja", "<|im_end|>", {}, "qwen3.5", _as_written(_xml, "\n</think>\n\n")),
    "hermes3": (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "<|im_end|>",
        {},
        "hermes",
        _as_written(_hermes),
    ),
    "llama3.1": ("meta-llama-Llama-3.1-8B-Instruct.jinja", "<|eot_id|>", {}, "llama3", _as_written(_llama)),
}
SAMPLE = "".join(FAMILIES[f][4][0] for f in FAMILIES) + '"price": 12.5 </think>\n\n'


def _tokenizer(make: TemplateTokenizer, templates: Path, name: str) -> Any:
    template, eos, *_ = FAMILIES[name]
    return make((templates / template).read_text(), eos, SAMPLE)


def _episode(tok: Any, kwargs: dict[str, Any], turns: list[str]) -> Transcript:
    """The episode a model of the family produces: its sampled ids, the environment's tool messages."""
    transcript = Transcript(tok, template_kwargs=kwargs)
    transcript.start(STRUCTURED[:2], tools=TOOLS)
    tool_messages = [m for m in STRUCTURED if m["role"] == "tool"]
    for n, text in enumerate(turns):
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        transcript.add_sampled(
            ScriptedCompletion(token_ids=ids, logprobs=[-1.0] * len(ids), text=text, finish_reason="stop")
        )
        if n < len(tool_messages):
            suffix = transcript.env_suffix([tool_messages[n]])
            assert not suffix.drifted
            transcript.commit_env(suffix)
    return transcript


def _target_turns(tok: Any, example: SFTExample) -> list[str]:
    """Each contiguous target span, decoded without its end-of-turn token."""
    spans: list[list[int]] = []
    for i, (t, m) in enumerate(zip(example.token_ids, example.assistant_mask, strict=True)):
        if m and (i == 0 or not example.assistant_mask[i - 1]):
            spans.append([])
        if m:
            spans[-1].append(t)
    return [tok.decode(s[:-1], skip_special_tokens=False) for s in spans]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_structured_demonstration_is_the_episode_of_a_model_writing_its_own_format(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer, name: str
) -> None:
    _, _, kwargs, _, turns = FAMILIES[name]
    tok = _tokenizer(template_tokenizer, chat_templates_dir, name)
    episode = _episode(tok, kwargs, turns)
    assert episode.drift_count == 0
    example = render_example(tok, STRUCTURED, TOOLS, template_kwargs=kwargs)
    n = len(episode.token_ids)
    assert example.token_ids[:n] == episode.token_ids
    assert example.assistant_mask[:n] == episode.loss_mask
    assert not any(example.assistant_mask[n:])
    assert _target_turns(tok, example) == turns


def _scripted(n: int) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    tasks = mcprl_tasks.read_tasks(mcprl_tasks.load_preset("default")[0])
    rng = random.Random(0)
    picked = rng.sample(tasks, n)
    return [(t, mcprl_tasks.imperfect_teacher(t, rng, p_typo=0.5)) for t in picked]


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_every_target_turn_of_the_scripted_demonstrations_parses_back_into_its_calls(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer, name: str
) -> None:
    _, _, kwargs, family, _ = FAMILIES[name]
    tok = _tokenizer(template_tokenizer, chat_templates_dir, name)
    parser = get_parser(family)
    checked = 0
    for task, messages in _scripted(12):
        example = render_example(tok, messages, TOOLS, template_kwargs=kwargs)
        targets = [m for m in messages if m["role"] == "assistant" and m.get("weight", 1) == 1]
        turns = _target_turns(tok, example)
        assert len(turns) == len(targets), task["id"]
        for message, text in zip(targets, turns, strict=True):
            parsed = parser.parse(text, tools=TOOLS)
            assert not parsed.errors, (task["id"], text)
            expected = [c["function"] for c in message.get("tool_calls", [])]
            assert [{"name": c.name, "arguments": c.arguments} for c in parsed.calls] == expected
            if not expected:
                assert parsed.answer is not None
                assert f"<answer>{parsed.answer}</answer>" == message["content"]
            checked += 1
    assert checked >= 2 * 12  # at least a call and an answer per demonstration


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    # transformers leaves AutoTokenizer.from_pretrained's parameters and return type unannotated.
    return AutoTokenizer.from_pretrained(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        build_tiny_model("tiny", cache_dir=Path(tmp_path_factory.mktemp("m")))
    )


def _as_text(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same demonstration with each call written into the assistant's text, compact Hermes form."""
    out = copy.deepcopy(messages)
    for m in out:
        calls = m.pop("tool_calls", None)
        if calls:
            m["content"] = "".join(
                mcprl_tasks.tool_call_text(c["function"]["name"], c["function"]["arguments"]) for c in calls
            )
    return out


def test_the_tiny_models_template_renders_structured_calls_as_its_compact_text_form(
    tiny_tokenizer: ChatTokenizer,
) -> None:
    for task, messages in _scripted(40):
        structured = render_example(tiny_tokenizer, messages, TOOLS)
        text = render_example(tiny_tokenizer, _as_text(messages), TOOLS)
        assert structured == text, task["id"]
    assert any(m.get("tool_calls") for m in mcprl_tasks.ideal_demo(_scripted(1)[0][0]))


def test_a_demonstration_the_template_refuses_is_a_demonstration_error(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer
) -> None:
    tok = _tokenizer(template_tokenizer, chat_templates_dir, "llama3.1")
    parallel = copy.deepcopy(STRUCTURED)
    parallel[2]["tool_calls"].append(_call("get_quote", symbol="BETA"))
    with pytest.raises(
        DemonstrationError, match=r"the model's chat template refuses it: .*single tool-calls"
    ):
        render_example(tok, parallel, TOOLS)


def test_thinking_on_the_scripted_demonstrations_reason_in_the_think_block_before_each_call(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer
) -> None:
    """Qwen3 with ``enable_thinking``: every target turn is the think block the template renders from the turn's
    ``reasoning_content`` (`mcprl_tasks.with_reasoning`), then the turn as the model writes it, parsed back."""
    kwargs = {"enable_thinking": True}
    tok = template_tokenizer((chat_templates_dir / "Qwen-Qwen3-0.6B.jinja").read_text(), "<|im_end|>", SAMPLE)
    parser = get_parser("hermes")
    checked = 0
    for task, plain in _scripted(6):
        messages = mcprl_tasks.with_reasoning(plain)
        example = render_example(tok, messages, TOOLS, template_kwargs=kwargs)
        targets = [m for m in messages if m["role"] == "assistant" and m.get("weight", 1) == 1]
        for message, text in zip(targets, _target_turns(tok, example), strict=True):
            think = f"<think>\n{message['reasoning_content']}\n</think>\n\n"
            assert text.startswith(think), (task["id"], text)
            calls = [c["function"] for c in message.get("tool_calls", [])]
            written = "\n".join(_hermes(c["name"], **c["arguments"]) for c in calls) or message["content"]
            assert text == think + written
            parsed = parser.parse(text, tools=TOOLS)
            assert not parsed.errors, (task["id"], text)
            assert [{"name": c.name, "arguments": c.arguments} for c in parsed.calls] == calls
            checked += 1
    assert checked >= 2 * 6
