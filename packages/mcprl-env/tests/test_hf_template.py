"""The shipped Qwen-style template with a real transformers tokenizer (skipped when transformers is absent).

A tiny byte-level BPE tokenizer is trained in memory; its chat template is `QWEN_STYLE_CHAT_TEMPLATE`.
"""

from __future__ import annotations

from typing import Any

import pytest
from env_testkit import call, make_task

from mcprl_env import Environment, HermesToolCallParser
from mcprl_env.testing import QWEN_STYLE_CHAT_TEMPLATE, ScriptedSampler, render_qwen_style

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

pytestmark = pytest.mark.anyio

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


@pytest.fixture(scope="module")
def hf_tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    corpus = [
        render_qwen_style([{"role": "user", "content": "What is 3 times 4.5?"}]),
        call("multiply", a=3, b=4.5) + '<tool_response>{"result": 13.5}</tool_response><answer>13.5</answer>',
        "You may call one or more functions to assist with the user query. Multiply two numbers.",
    ] * 20
    tk.train_from_iterator(corpus, trainer)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tk,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = QWEN_STYLE_CHAT_TEMPLATE
    return tok


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers. ünï",
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}, "required": ["a"]},
        },
    }
]
CONVERSATIONS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    [
        {"role": "user", "content": "3*4.5?"},
        {"role": "assistant", "content": call("multiply", a=3, b=4.5)},
        {"role": "tool", "name": "multiply", "content": "13.5"},
        {"role": "tool", "name": "multiply", "content": "again"},
        {"role": "assistant", "content": "<answer>13.5</answer>"},
    ],
    [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "tool_calls": [
                {"type": "function", "function": {"name": "multiply", "arguments": {"a": 1, "b": "é"}}},
                {"type": "function", "function": {"name": "divide", "arguments": {}}},
            ],
        },
    ],
]


@pytest.mark.parametrize("tools", [None, TOOLS])
@pytest.mark.parametrize("generation", [False, True])
@pytest.mark.parametrize("conversation", CONVERSATIONS)
def test_python_renderer_matches_the_jinja_template(
    hf_tokenizer: Any, conversation: list[dict[str, Any]], tools: Any, generation: bool
) -> None:
    jinja = hf_tokenizer.apply_chat_template(
        conversation, tools=tools, add_generation_prompt=generation, tokenize=False
    )
    assert jinja == render_qwen_style(conversation, tools=tools, add_generation_prompt=generation)


def test_a_call_rendered_by_the_hf_template_parses_back(hf_tokenizer: Any) -> None:
    conversation = CONVERSATIONS[3]
    head = hf_tokenizer.apply_chat_template(conversation[:1], add_generation_prompt=True, tokenize=False)
    full = hf_tokenizer.apply_chat_template(conversation, tokenize=False)
    turn = HermesToolCallParser().parse(full[len(head) :].removesuffix("<|im_end|>\n"))
    assert [(c.name, c.arguments) for c in turn.calls] == [("multiply", {"a": 1, "b": "é"}), ("divide", {})]


async def test_episode_with_a_hf_tokenizer_is_token_exact(hf_tokenizer: Any) -> None:
    from env_testkit import memory_manager

    script = [call("multiply", a=3, b=4.5), "<answer>13.5</answer>"]
    async with memory_manager(call_timeout=5) as manager:
        env = Environment(manager=manager, tokenizer=hf_tokenizer)
        ep = await env.run_episode(make_task(), ScriptedSampler(hf_tokenizer, script))
        tools = list(env.tool_access(make_task()).schemas)
    assert ep.valid
    assert ep.success
    assert ep.stop_reason == "answer"
    full = hf_tokenizer.apply_chat_template(ep.messages, tools=tools, tokenize=False)
    assert ep.token_ids == hf_tokenizer.encode(full.removesuffix("\n"), add_special_tokens=False)
    sampled = [[*hf_tokenizer.encode(t, add_special_tokens=False), hf_tokenizer.eos_token_id] for t in script]
    assert [t for t, m in zip(ep.token_ids, ep.loss_mask, strict=True) if m] == [
        t for s in sampled for t in s
    ]
