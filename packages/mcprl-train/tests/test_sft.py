"""Rendering demonstrations for the warm start: which tokens are targets."""

from __future__ import annotations

import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from mcprl_env import ChatTokenizer
from mcprl_policy.tiny import build_tiny_model
from mcprl_train.errors import DemonstrationError
from mcprl_train.loop.warm_start import SFTExample, render_example

TemplateTokenizer = Callable[
    [str, str, str], Any
]  # the conftest fixture: (template, eos, sample) -> tokenizer

CALL = '<tool_call>{"name": "get_quote", "arguments": {"symbol": "ACME"}}</tool_call>'


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> ChatTokenizer:
    # transformers leaves AutoTokenizer.from_pretrained's parameters and return type unannotated.
    return AutoTokenizer.from_pretrained(  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        build_tiny_model("tiny", cache_dir=Path(tmp_path_factory.mktemp("m")))
    )


def _conversation(first_weight: int | None) -> list[dict[str, object]]:
    first: dict[str, object] = {"role": "assistant", "content": CALL.replace("ACME", "ACNE")}
    if first_weight is not None:
        first["weight"] = first_weight
    return [
        {"role": "user", "content": "Price of ACME?"},
        first,
        {"role": "tool", "content": "Error executing tool get_quote: Unknown symbol 'ACNE'."},
        {"role": "assistant", "content": CALL},
        {"role": "tool", "content": '{"symbol":"ACME","price":12.5}'},
        {"role": "assistant", "content": "<answer>12.5</answer>"},
    ]


def _targets(tokenizer: ChatTokenizer, example: SFTExample) -> str:
    ids = [t for t, m in zip(example.token_ids, example.assistant_mask, strict=True) if m]
    return tokenizer.decode(ids)


def test_a_weight_0_message_stays_in_context_but_is_not_a_target(tokenizer: ChatTokenizer) -> None:
    full = render_example(tokenizer, _conversation(None), None)
    masked = render_example(tokenizer, _conversation(0), None)
    assert masked.token_ids == full.token_ids  # same context
    assert "ACNE" in _targets(tokenizer, full)
    assert "ACNE" not in _targets(tokenizer, masked)
    assert "ACME" in _targets(tokenizer, masked)
    assert "12.5" in _targets(tokenizer, masked)
    assert sum(masked.assistant_mask) < sum(full.assistant_mask)
    assert render_example(tokenizer, _conversation(1), None) == full


@pytest.mark.parametrize("weight", [2, 0.5, True, "0"])
def test_a_weight_other_than_0_or_1_is_refused(tokenizer: ChatTokenizer, weight: object) -> None:
    messages = _conversation(None)
    messages[1]["weight"] = weight
    with pytest.raises(ValueError, match="weight must be 0 or 1"):
        render_example(tokenizer, messages, None)


def test_a_demonstration_whose_every_assistant_message_has_weight_0_is_refused(
    tokenizer: ChatTokenizer,
) -> None:
    messages = [{**m, "weight": 0} if m["role"] == "assistant" else m for m in _conversation(None)]
    with pytest.raises(ValueError, match="no assistant tokens"):
        render_example(tokenizer, messages, None)


def _spans(tokenizer: ChatTokenizer, example: SFTExample) -> list[str]:
    """The decoded text of each run of target tokens, in order."""
    spans: list[list[int]] = []
    for i, (t, m) in enumerate(zip(example.token_ids, example.assistant_mask, strict=True)):
        if m and (i == 0 or not example.assistant_mask[i - 1]):
            spans.append([])
        if m:
            spans[-1].append(t)
    return [tokenizer.decode(s) for s in spans]


def test_the_template_markers_and_prefix_rendering_give_the_same_targets(tokenizer: ChatTokenizer) -> None:
    marked = render_example(tokenizer, _conversation(None), None)
    plain: Any = copy.copy(tokenizer)
    plain.chat_template = re.sub(r"\{%-?\s*(end)?generation\s*-?%\}", "", plain.chat_template)
    assert not re.search(r"\{%-?\s*generation", plain.chat_template)
    assert render_example(plain, _conversation(None), None) == marked
    assert render_example(plain, _conversation(0), None) == render_example(tokenizer, _conversation(0), None)


TOOLS: list[dict[str, Any]] = [
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
    }
]
DEMO: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "What is 3 times 4?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "multiply", "arguments": {"a": 3, "b": 4}}}],
    },
    {"role": "tool", "content": "12"},
    {"role": "assistant", "content": "3 times 4 is 12."},
]
HERMES_CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4}}\n</tool_call>'

# template → (end-of-turn token, template kwargs, each assistant turn's targets exactly)
REAL_TEMPLATES: dict[str, tuple[str, dict[str, Any], list[str]]] = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": (
        "<|im_end|>",
        {},
        [HERMES_CALL + "<|im_end|>", "3 times 4 is 12.<|im_end|>"],
    ),
    "Qwen-Qwen3-0.6B.jinja": (
        "<|im_end|>",
        {"enable_thinking": False},
        [HERMES_CALL + "<|im_end|>", "3 times 4 is 12.<|im_end|>"],
    ),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": (
        "<|eot_id|>",
        {},
        ['{"name": "multiply", "parameters": {"a": 3, "b": 4}}<|eot_id|>', "3 times 4 is 12.<|eot_id|>"],
    ),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": (
        "<|im_end|>",
        {},
        [HERMES_CALL + "<|im_end|>", "3 times 4 is 12.<|im_end|>"],
    ),
}
SFT_SAMPLE = HERMES_CALL + "\n3 times 4 is 12.\n\n"


@pytest.mark.parametrize("name", sorted(REAL_TEMPLATES))
def test_each_real_template_trains_exactly_each_assistant_turn_and_its_end_of_turn_token(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer, name: str
) -> None:
    eos, kwargs, turns = REAL_TEMPLATES[name]
    tok = template_tokenizer((chat_templates_dir / name).read_text(), eos, SFT_SAMPLE)
    example = render_example(tok, DEMO, TOOLS, template_kwargs=kwargs)
    assert _spans(tok, example) == turns
    assert all(example.token_ids[i] == tok.eos_token_id for i in _span_ends(example))
    context = tok.decode([t for t, m in zip(example.token_ids, example.assistant_mask, strict=True) if not m])
    for text in ("You are a calculator.", "What is 3 times 4?", "12"):
        assert text in context
    assert "multiply" in context  # the tool schema in the system prompt, never a target
    # The whole sequence is the template's rendering (as the model generated it, where the template
    # re-renders a turn once it is no longer last).
    rendered = tok.apply_chat_template(DEMO, tools=TOOLS, tokenize=False, **kwargs)
    held = tok.decode(example.token_ids)
    if name == "Qwen-Qwen3-0.6B.jinja":
        # Qwen3 drops an earlier turn's empty think block; the model generated after it, so it stays.
        assert held == rendered.replace(
            "assistant\n<tool_call>", "assistant\n<think>\n\n</think>\n\n<tool_call>"
        )
    elif name.startswith("NousResearch-Hermes-3"):
        # Hermes 3 ends the last tool response without a newline; the model was prompted with that.
        assert held == rendered.replace("</tool_response>\n<|im_end|>", "</tool_response><|im_end|>")
    else:
        assert held == rendered


def _span_ends(example: SFTExample) -> list[int]:
    m = example.assistant_mask
    return [i for i in range(len(m)) if m[i] and (i + 1 == len(m) or not m[i + 1])]


def test_a_weight_0_turn_keeps_its_tokens_in_context_on_a_real_template(
    chat_templates_dir: Path, template_tokenizer: TemplateTokenizer
) -> None:
    tok = template_tokenizer(
        (chat_templates_dir / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(), "<|im_end|>", SFT_SAMPLE
    )
    demo = [*DEMO[:2], {**DEMO[2], "weight": 0}, *DEMO[3:]]
    full = render_example(tok, DEMO, TOOLS)
    masked = render_example(tok, demo, TOOLS)
    assert masked.token_ids == full.token_ids
    assert _spans(tok, masked) == ["3 times 4 is 12.<|im_end|>"]


def test_a_template_that_rewrites_earlier_text_is_a_demonstration_error_naming_the_message(
    template_tokenizer: TemplateTokenizer,
) -> None:
    # A header that counts the messages: every longer rendering rewrites the start of the conversation.
    template = (
        "{{ messages | length }} messages\n{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = template_tokenizer(template, "<|im_end|>", SFT_SAMPLE)
    messages = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]
    with pytest.raises(DemonstrationError, match=r"message 1 .*not prefix-stable"):
        render_example(tok, messages, None)


def test_a_template_that_rewrites_the_latest_turn_keeps_it_as_generated(
    template_tokenizer: TemplateTokenizer,
) -> None:
    # Like Qwen3's dropped think block: an assistant turn renders differently once it is not last.
    template = (
        "{% for m in messages %}<|im_start|>{{ m.role }}\n"
        "{% if m.role == 'assistant' and not loop.last %}(earlier){% else %}{{ m.content }}{% endif %}"
        "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    tok = template_tokenizer(template, "<|im_end|>", SFT_SAMPLE)
    messages = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        {"role": "assistant", "content": "e"},
    ]
    example = render_example(tok, messages, None)
    assert _spans(tok, example) == ["b<|im_end|>", "e<|im_end|>"]
    assert "(earlier)" not in tok.decode(example.token_ids)


def test_an_assistant_turn_without_an_end_of_turn_token_is_refused(
    template_tokenizer: TemplateTokenizer,
) -> None:
    template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tok = template_tokenizer(template, "<|im_end|>", SFT_SAMPLE)
    with pytest.raises(DemonstrationError, match=r"message 1 .*without an end-of-turn token"):
        render_example(tok, [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}], None)
