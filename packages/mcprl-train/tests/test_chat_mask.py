"""The warm start's sequences are the episodes' sequences: one convention for SFT and RL on every real template.

An episode driven through `mcprl_env.Transcript` as each model family writes it (its sampled ids, the tool
responses, the template's text after each turn) and the same conversation rendered as a demonstration by
`prefix_diff_targets` are the same ids with the same mask; the demonstration only adds what the template
renders after the final end-of-turn token.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from mcprl_env import Transcript
from mcprl_env.testing import ScriptedCompletion
from mcprl_train.loop.chat_mask import prefix_diff_targets

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

TemplateTokenizer = Callable[
    [str, str, str], Any
]  # the conftest fixture: (template, eos, sample) -> tokenizer

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.title()} two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
    for name in ("multiply", "divide")
]


def hermes(name: str, **arguments: Any) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def qwen_xml(name: str, **arguments: Any) -> str:
    params = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in arguments.items())
    return f"<tool_call>\n<function={name}>\n{params}</function>\n</tool_call>"


def llama(name: str, **arguments: Any) -> str:
    return json.dumps({"name": name, "parameters": arguments})


MASK_SAMPLE = hermes("multiply", a=3, b=4.5) + "\n</think>\n\n"  # what the test tokenizer is trained on
HERMES_SCRIPT = [hermes("multiply", a=3, b=4.5), hermes("divide", a=27, b=2), "<answer>13.5</answer>"]
# name → (template, end-of-turn token, template kwargs, turns as the model writes them, tool responses per turn)
FAMILIES: dict[str, tuple[str, str, dict[str, Any], list[str], list[list[str]]]] = {
    "qwen2.5": ("Qwen-Qwen2.5-7B-Instruct.jinja", "<|im_end|>", {}, HERMES_SCRIPT, [["13.5"], ["13.5"]]),
    "qwen3-thinking-off": (
        "Qwen-Qwen3-0.6B.jinja",
        "<|im_end|>",
        {"enable_thinking": False},
        HERMES_SCRIPT,
        [["13.5"], ["13.5"]],
    ),
    "qwen3-thinking-on": (
        "Qwen-Qwen3-0.6B.jinja",
        "<|im_end|>",
        {"enable_thinking": True},
        [
            "<think>\nMultiply 3 by 4.5.\n</think>\n\n" + hermes("multiply", a=3, b=4.5),
            "<think>\nCheck by halving 27.\n</think>\n\n" + hermes("divide", a=27, b=2),
            "<think>\nBoth give 13.5.\n</think>\n\n<answer>13.5</answer>",
        ],
        [["13.5"], ["13.5"]],
    ),
    "qwen3.5": (
        "Qwen3.5-4B.jinja",
        "<|im_end|>",
        {},
        [
            "Multiply 3 by 4.5.\n</think>\n\n" + qwen_xml("multiply", a=3, b=4.5),
            "Check by halving 27.\n</think>\n\n" + qwen_xml("divide", a=27, b=2),
            "Both give 13.5.\n</think>\n\n<answer>13.5</answer>",
        ],
        [["13.5"], ["13.5"]],
    ),
    "hermes3": (
        "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        "<|im_end|>",
        {},
        [
            hermes("multiply", a=3, b=4.5) + "\n" + hermes("divide", a=9, b=2),
            hermes("divide", a=27, b=2),
            "<answer>13.5</answer>",
        ],
        [["13.5", "4.5"], ["13.5"]],
    ),
    "llama3.1": (
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "<|eot_id|>",
        {},
        [llama("multiply", a=3, b=4.5), llama("divide", a=27, b=2), "<answer>13.5</answer>"],
        [["13.5"], ["13.5"]],
    ),
}


def _episode(tok: Any, kwargs: dict[str, Any], script: list[str], responses: list[list[str]]) -> Transcript:
    transcript = Transcript(tok, template_kwargs=kwargs)
    transcript.start(
        [
            {"role": "system", "content": "You are a calculator."},
            {"role": "user", "content": "What is 3 times 4.5?"},
        ],
        tools=TOOLS,
    )
    for n, text in enumerate(script):
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        transcript.add_sampled(
            ScriptedCompletion(token_ids=ids, logprobs=[-1.0] * len(ids), text=text, finish_reason="stop")
        )
        if n < len(responses):
            suffix = transcript.env_suffix([{"role": "tool", "content": r} for r in responses[n]])
            assert not suffix.drifted
            transcript.commit_env(suffix)
    return transcript


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_a_demonstration_of_an_episodes_conversation_is_the_episodes_ids_and_mask(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer, name: str
) -> None:
    template, eos, kwargs, script, responses = FAMILIES[name]
    tok = template_tokenizer((chat_templates_dir / template).read_text(), eos, MASK_SAMPLE)
    episode = _episode(tok, kwargs, script, responses)
    assert episode.drift_count == 0
    weights = [1] * sum(m["role"] == "assistant" for m in episode.messages)
    ids, mask = prefix_diff_targets(
        tok, episode.messages, weights, tools=TOOLS, template_kwargs=kwargs, end_of_turn={tok.eos_token_id}
    )
    n = len(episode.token_ids)
    assert ids[:n] == episode.token_ids
    assert mask[:n] == episode.loss_mask
    # After the final end-of-turn token, the demonstration holds the template's closing text as context.
    rendered = tok.apply_chat_template(episode.messages, tools=TOOLS, tokenize=False, **kwargs)
    assert tok.decode(ids[n:]) == rendered[rendered.rindex(eos) + len(eos) :]
    assert not any(mask[n:])


def _real_tokenizer(chat_templates_dir: Path, name: str) -> Any:
    """The family's published vocabulary (`mcprl_policy.standin`) with the family's template."""
    from mcprl_policy.standin import llama_tokenizer, qwen35_tokenizer, qwen_tokenizer

    template = (chat_templates_dir / FAMILIES[name][0]).read_text()
    if name == "qwen3.5":
        tiktoken_file = chat_templates_dir / "qwen3_6.tiktoken"
        if not tiktoken_file.is_file():
            pytest.skip(
                f"qwen3_6.tiktoken is not in {chat_templates_dir}: scripts/fetch-chat-templates.py could not fetch it"
            )
        return qwen35_tokenizer(tiktoken_file, chat_template=template)
    pytest.importorskip("gguf", reason="the vocabularies are read from .gguf files: pip install gguf")
    match name:
        case "llama3.1" | "hermes3":
            release = "llama3.1" if name == "llama3.1" else "hermes3"
            gguf_file = chat_templates_dir / "ggml-vocab-llama-bpe.gguf"
            return llama_tokenizer(gguf_file, release=release, chat_template=template)
        case _:
            gguf_file = chat_templates_dir / "ggml-vocab-qwen2.gguf"
            return qwen_tokenizer(gguf_file, release="qwen3", chat_template=template)


@pytest.mark.parametrize("name", ["llama3.1", "hermes3", "qwen3-thinking-off", "qwen3.5"])
def test_a_demonstration_is_the_episode_on_the_families_real_vocabulary(
    chat_templates_dir: Path, name: str
) -> None:
    _, eos, kwargs, script, responses = FAMILIES[name]
    tok = _real_tokenizer(chat_templates_dir, name)
    assert tok.eos_token == eos
    episode = _episode(tok, kwargs, script, responses)
    assert episode.drift_count == 0
    weights = [1] * sum(m["role"] == "assistant" for m in episode.messages)
    ids, mask = prefix_diff_targets(
        tok, episode.messages, weights, tools=TOOLS, template_kwargs=kwargs, end_of_turn={tok.eos_token_id}
    )
    n = len(episode.token_ids)
    assert ids[:n] == episode.token_ids
    assert mask[:n] == episode.loss_mask
    assert not any(mask[n:])
    sampled = [[*tok.encode(text, add_special_tokens=False), tok.eos_token_id] for text in script]
    assert [t for t, m in zip(ids, mask, strict=True) if m] == [t for turn in sampled for t in turn]


def _structured_call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_thinking_demonstration_with_reasoning_content_is_the_episode_on_the_real_qwen3_vocabulary(
    chat_templates_dir: Path,
) -> None:
    """Thinking on: a structured demonstration (``reasoning_content`` and ``tool_calls``) is rendered by the real
    Qwen3 template into the turns a thinking model samples, token for token on the real Qwen3 vocabulary."""
    pytest.importorskip("gguf", reason="the Qwen vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import qwen_tokenizer

    template = (chat_templates_dir / "Qwen-Qwen3-0.6B.jinja").read_text()
    tok: Any = qwen_tokenizer(
        chat_templates_dir / "ggml-vocab-qwen2.gguf", release="qwen3", chat_template=template
    )
    kwargs = {"enable_thinking": True}
    reasoning = ["Multiply 3 by 4.5.", "Check by halving 27.", "Both give 13.5."]
    script = [
        f"<think>\n{reasoning[0]}\n</think>\n\n" + hermes("multiply", a=3, b=4.5),
        f"<think>\n{reasoning[1]}\n</think>\n\n" + hermes("divide", a=27, b=2),
        f"<think>\n{reasoning[2]}\n</think>\n\n<answer>13.5</answer>",
    ]
    episode = _episode(tok, kwargs, script, [["13.5"], ["13.5"]])
    assert episode.drift_count == 0
    demo = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 3 times 4.5?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": reasoning[0],
            "tool_calls": [_structured_call("multiply", a=3, b=4.5)],
        },
        {"role": "tool", "content": "13.5"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": reasoning[1],
            "tool_calls": [_structured_call("divide", a=27, b=2)],
        },
        {"role": "tool", "content": "13.5"},
        {"role": "assistant", "content": "<answer>13.5</answer>", "reasoning_content": reasoning[2]},
    ]
    ids, mask = prefix_diff_targets(
        tok, demo, [1, 1, 1], tools=TOOLS, template_kwargs=kwargs, end_of_turn={tok.eos_token_id}
    )
    n = len(episode.token_ids)
    assert ids[:n] == episode.token_ids
    assert mask[:n] == episode.loss_mask
    assert not any(mask[n:])
    targets = [tok.decode(ids[i : i + 1]) for i in range(len(ids)) if mask[i]]
    assert "".join(targets) == "".join(f"{turn}<|im_end|>" for turn in script)
    assert max(ids) < 151_669
