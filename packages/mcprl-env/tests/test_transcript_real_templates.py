"""Episodes written as each model family writes them, on the vendor's own chat template: token-exact, no drift.

Each episode's ids must be the prompt, then for each turn the sampled ids and what the template renders after
that turn's end-of-turn token (the tool responses and the next generation prompt), computed here from the
template directly. The held text is the template's rendering of the whole conversation except where the
template rewrites a turn once it is no longer the newest, which stays as the model saw or generated it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
from env_testkit import make_task
from real_templates import tokenizer_with_template

from mcprl_env import EnvConfig, Environment, Episode, TemplateDriftError, Transcript
from mcprl_env.testing import ScriptedCompletion, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")


def hermes(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def qwen_xml(name: str, **arguments: Any) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def llama(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "parameters": arguments})


def _same(rendered: str) -> str:
    return rendered


@attrs.frozen(kw_only=True)
class Family:
    template: str
    script: list[str]
    kwargs: dict[str, Any] = attrs.field(factory=dict)
    eos: str = "<|im_end|>"
    header: str = "<|im_start|>assistant"
    # The template's rendering of the finished conversation, turned into the text the episode holds.
    as_held: Callable[[str], str] = _same


def _qwen3_off(rendered: str) -> str:
    # Qwen3 drops the empty think block of a turn once it is not last; the model generated after it.
    assert "assistant\n<tool_call>" in rendered
    return rendered.replace("assistant\n<tool_call>", "assistant\n<think>\n\n</think>\n\n<tool_call>")[:-1]


def _hermes3(rendered: str) -> str:
    # Hermes 3 ends the last tool response without a newline until an assistant message follows.
    assert "</tool_response>\n<|im_end|>" in rendered
    return rendered.replace("</tool_response>\n<|im_end|>", "</tool_response><|im_end|>")


def _qwen3_unspaced(rendered: str) -> str:
    # Each turn as the model wrote it, where the template adds newlines (or a think block, to the last turn)
    # or drops an empty think block.
    return (
        rendered.replace("<think>\nMultiply 3 by 4.5.\n</think>\n\n", "<think>Multiply 3 by 4.5.</think>")
        .replace("assistant\n<tool_call>", "assistant\n<think></think><tool_call>")
        .replace("<think>\n\n</think>\n\n<answer>", "<answer>")[:-1]
    )


FAMILIES: dict[str, Family] = {
    "qwen2.5": Family(
        template="Qwen-Qwen2.5-7B-Instruct.jinja",
        script=[hermes("multiply", a=3, b=4.5), hermes("divide", a=27, b=2), "<answer>13.5</answer>"],
        as_held=lambda r: r[:-1],
    ),
    "qwen3-thinking-off": Family(
        template="Qwen-Qwen3-0.6B.jinja",
        kwargs={"enable_thinking": False},
        script=[hermes("multiply", a=3, b=4.5), hermes("divide", a=27, b=2), "<answer>13.5</answer>"],
        as_held=_qwen3_off,
    ),
    "qwen3-thinking-on": Family(
        template="Qwen-Qwen3-0.6B.jinja",
        kwargs={"enable_thinking": True},
        script=[
            "<think>\nMultiply 3 by 4.5.\n</think>\n\n" + hermes("multiply", a=3, b=4.5),
            "<think>\nCheck by halving 27.\n</think>\n\n" + hermes("divide", a=27, b=2),
            "<think>\nBoth give 13.5.\n</think>\n\n<answer>13.5</answer>",
        ],
        as_held=lambda r: r[:-1],
    ),
    "qwen3-thinking-on-unspaced": Family(
        # A think block without the template's newlines: re-rendered differently once the turn is not last.
        template="Qwen-Qwen3-0.6B.jinja",
        script=[
            "<think>Multiply 3 by 4.5.</think>" + hermes("multiply", a=3, b=4.5),
            "<think></think>" + hermes("divide", a=27, b=2),
            "<answer>13.5</answer>",
        ],
        as_held=_qwen3_unspaced,
    ),
    "qwen3.5": Family(
        template="Qwen3.5-4B.jinja",
        script=[
            "Multiply 3 by 4.5.\n</think>\n\n" + qwen_xml("multiply", a=3, b=4.5),
            "Check by halving 27.\n</think>\n\n" + qwen_xml("divide", a=27, b=2),
            "Both give 13.5.\n</think>\n\n<answer>13.5</answer>",
        ],
        as_held=lambda r: r[:-1],
    ),
    "hermes3": Family(
        template="NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        script=[
            hermes("multiply", a=3, b=4.5) + "\n" + hermes("divide", a=9, b=2),
            hermes("divide", a=27, b=2),
            hermes("multiply", a=1, b=13.5),
            "<answer>13.5</answer>",
        ],
        as_held=lambda r: _hermes3(r)[:-1],
    ),
    "llama3.1": Family(
        template="meta-llama-Llama-3.1-8B-Instruct.jinja",
        eos="<|eot_id|>",
        header="<|start_header_id|>assistant<|end_header_id|>",
        script=[llama("multiply", a=3, b=4.5), llama("divide", a=27, b=2), "<answer>13.5</answer>"],
    ),
}


def _tokenizer(chat_templates_dir: Path, family: Family) -> Any:
    return tokenizer_with_template((chat_templates_dir / family.template).read_text(), family.eos)


async def _episode(
    tok: Any, family: Family, manager: ToolManager, **config: Any
) -> tuple[Episode, Environment]:
    env = Environment(
        manager=manager, tokenizer=tok, config=EnvConfig(chat_template_kwargs=family.kwargs, **config)
    )
    sampler = ScriptedSampler(tok, family.script, assistant_header=family.header)
    return await env.run_episode(make_task(), sampler), env


def _after_turn(tok: Any, family: Family, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """What the template renders after the end-of-turn token of the last assistant turn in ``messages``."""
    plain = tok.apply_chat_template(messages, tools=tools, tokenize=False, **family.kwargs)
    prompted = tok.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True, **family.kwargs
    )
    assert prompted.startswith(plain)
    end = plain.index(family.eos, plain.rindex(family.header)) + len(family.eos)
    return plain[end:] + prompted[len(plain) :]


@pytest.mark.parametrize("name", sorted(FAMILIES))
async def test_an_episode_is_its_sampled_ids_and_what_the_template_renders_after_each_turn(
    chat_templates_dir: Path, manager: ToolManager, name: str
) -> None:
    family = FAMILIES[name]
    tok = _tokenizer(chat_templates_dir, family)
    ep, env = await _episode(tok, family, manager)
    assert (ep.valid, ep.stop_reason, ep.success, ep.error) == (True, "answer", True, None)
    assert ep.metrics["template_drift"] == 0.0
    assert ep.metrics["parse_errors"] == 0.0
    assert ep.metrics["turns"] == len(family.script)
    tools = list(env.tool_access(make_task()).schemas)
    turns = [k for k, m in enumerate(ep.messages) if m["role"] == "assistant"]
    prompt = tok.apply_chat_template(
        ep.messages[:1], tools=tools, tokenize=False, add_generation_prompt=True, **family.kwargs
    )
    expected: list[int] = tok.encode(prompt, add_special_tokens=False)
    mask = [0] * len(expected)
    for n, text in enumerate(family.script):
        sampled = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        expected += sampled
        mask += [1] * len(sampled)
        if n + 1 < len(turns):
            suffix = tok.encode(
                _after_turn(tok, family, ep.messages[: turns[n + 1]], tools), add_special_tokens=False
            )
            expected += suffix
            mask += [0] * len(suffix)
    assert ep.token_ids == expected
    assert ep.loss_mask == mask
    rendered = tok.apply_chat_template(ep.messages, tools=tools, tokenize=False, **family.kwargs)
    assert tok.decode(ep.token_ids) == family.as_held(rendered)


async def test_a_drifting_template_is_still_drift_on_a_real_tokenizer(
    chat_templates_dir: Path, manager: ToolManager
) -> None:
    # Qwen2.5's template, except that the user's message changes once the conversation goes on.
    template = (chat_templates_dir / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
    drifting = template.replace(
        "message.content + '<|im_end|>' + '\\n' }}",
        "message.content + (' (' ~ messages|length ~ ')' if message.role == 'user' else '') + '<|im_end|>' + '\\n' }}",
        1,
    )
    assert drifting != template
    family = attrs.evolve(FAMILIES["qwen2.5"], template="")
    tok = tokenizer_with_template(drifting)
    ep, _ = await _episode(tok, family, manager)
    assert (ep.valid, ep.stop_reason) == (False, "template_drift")
    assert ep.error is not None
    assert "What is 3 times 4.5? (" in ep.error
    ep, _ = await _episode(tok, family, manager, on_template_drift="report")
    assert (ep.valid, ep.success, ep.metrics["template_drift"]) == (True, True, 2.0)
    held = tok.decode(ep.token_ids)
    assert held.count("<|im_start|>assistant\n") == 3
    assert held.count("<tool_response>") == 2


def test_a_rewrite_of_the_environments_text_beyond_whitespace_is_drift(chat_templates_dir: Path) -> None:
    # Hermes 3's template, except that the last tool response is marked as such until an assistant follows.
    template = (chat_templates_dir / "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja").read_text()
    drifting = template.replace("{{- '\n</tool_response>' }}", "{{- '\n</tool_response>(last)' }}", 1)
    assert drifting != template
    tok = tokenizer_with_template(drifting)
    transcript = Transcript(tok)
    tools = [
        {"type": "function", "function": {"name": "multiply", "description": "Multiply.", "parameters": {}}}
    ]
    transcript.start([{"role": "user", "content": "What is 3 times 4.5?"}], tools=tools)
    for turn in range(2):
        ids = [*tok.encode(hermes("multiply", a=3, b=4.5)), tok.eos_token_id]
        transcript.add_sampled(
            ScriptedCompletion(token_ids=ids, logprobs=[0.0] * len(ids), text="", finish_reason="stop")
        )
        if turn == 0:
            transcript.commit_env(transcript.env_suffix([{"role": "tool", "content": "13.5"}]))
    with pytest.raises(TemplateDriftError) as info:
        transcript.env_suffix([{"role": "tool", "content": "13.5"}])
    assert info.value.expected.startswith("(last)")
