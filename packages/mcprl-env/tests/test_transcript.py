"""Token exactness: concatenated ids equal the template's rendering; masks cover exactly the sampled ids."""

from __future__ import annotations

import re
from typing import Any

import pytest
from env_testkit import call, make_task

from mcprl_env import EnvConfig, Environment, TemplateDriftError, Transcript
from mcprl_env.testing import CharTokenizer, ScriptedCompletion, ScriptedSampler, render_qwen_style
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio

SCRIPT = [
    "<think>multiply first</think>" + call("multiply", a=3, b=4.5),
    "Checking." + call("divide", a=27, b=2) + "\n" + call("multiply", a=1, b=13.5),
    "<answer>13.5</answer>",
]


async def test_episode_ids_equal_the_rendering_of_the_whole_conversation(manager: ToolManager) -> None:
    tok = CharTokenizer()
    sampler = ScriptedSampler(tok, SCRIPT, logprob=-0.5)
    env = Environment(manager=manager, tokenizer=tok)
    ep = await env.run_episode(make_task(), sampler)
    assert ep.stop_reason == "answer"
    assert ep.metrics["turns"] == 3
    tools = env.tool_access(make_task()).schemas
    full = tok.apply_chat_template(ep.messages, tools=list(tools), tokenize=False)
    # The episode ends on the sampled end-of-turn id; the template adds one newline after it.
    assert full.endswith("<|im_end|>\n")
    assert ep.token_ids == tok.encode(full[:-1])
    prompt = tok.apply_chat_template(ep.messages[:1], tools=list(tools), add_generation_prompt=True)
    assert ep.prompt_length == len(tok.encode(prompt))


async def test_loss_mask_covers_exactly_the_sampled_ids(manager: ToolManager) -> None:
    tok = CharTokenizer()
    sampler = ScriptedSampler(tok, SCRIPT, logprob=-0.5)
    ep = await Environment(manager=manager, tokenizer=tok).run_episode(make_task(), sampler)
    sampled = [[*tok.encode(text), tok.eos_token_id] for text in SCRIPT]
    masked = [ep.token_ids[i] for i, m in enumerate(ep.loss_mask) if m == 1]
    assert masked == [t for turn in sampled for t in turn]
    # Each sampled turn is a contiguous run that starts right after a generation prompt.
    runs = [m.span() for m in re.finditer("1+", "".join(map(str, ep.loss_mask)))]
    assert len(runs) == 3
    for start, _ in runs:
        assert tok.decode(ep.token_ids[:start]).endswith("<|im_start|>assistant\n")
    assert all((lp == -0.5) == (m == 1) for lp, m in zip(ep.sampler_logprobs, ep.loss_mask, strict=True))
    assert all(m == 0 for m in ep.loss_mask[: ep.prompt_length])
    assert ep.metrics["tokens/sampled"] == sum(ep.loss_mask)
    assert (
        ep.metrics["tokens/total"]
        == ep.metrics["tokens/sampled"] + ep.metrics["tokens/env"] + ep.prompt_length
    )


async def test_sampler_ids_are_kept_even_when_not_canonical(manager: ToolManager) -> None:
    class Noncanonical:
        """Samples the answer with an id the tokenizer would never produce for it (an out-of-vocab id)."""

        async def sample(
            self, prompt_ids: Any, *, max_new_tokens: int, seed: int | None = None
        ) -> ScriptedCompletion:
            ids = [*CharTokenizer().encode("13.5"), 2]
            return ScriptedCompletion(token_ids=ids, logprobs=[-1.0] * 5, text="13.5", finish_reason="stop")

    tok = CharTokenizer()
    ep = await Environment(manager=manager, tokenizer=tok).run_episode(make_task(), Noncanonical())
    assert ep.token_ids[ep.prompt_length :] == [*tok.encode("13.5"), 2]
    assert ep.success


class ThinkStrippingTokenizer(CharTokenizer):
    """A template that drops the think blocks of assistant turns once they are not last (as Qwen3 does)."""

    def apply_chat_template(
        self,
        conversation: Any,
        *,
        tools: Any = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> Any:
        cleaned = [
            {**m, "content": re.sub(r"<think>.*?</think>", "", m["content"], flags=re.S)}
            if m["role"] == "assistant" and i + 1 < len(conversation)
            else m
            for i, m in enumerate(conversation)
        ]
        text = render_qwen_style(cleaned, tools=tools, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text


class CountingTokenizer(CharTokenizer):
    """A genuinely inconsistent template: the user's message names how many messages follow it."""

    def apply_chat_template(
        self,
        conversation: Any,
        *,
        tools: Any = None,
        add_generation_prompt: bool = False,
        tokenize: bool = False,
        **kwargs: Any,
    ) -> Any:
        counted = [
            {**m, "content": f"{m['content']} ({len(conversation) - i - 1} later)"}
            if m["role"] == "user"
            else m
            for i, m in enumerate(conversation)
        ]
        text = render_qwen_style(counted, tools=tools, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text


def after_last_turn(rendered: str, header: str, end: str) -> str:
    """What ``rendered`` has after the end-of-turn marker of its last assistant turn."""
    return rendered[rendered.index(end, rendered.rindex(header)) + len(end) :]


async def test_a_template_that_drops_earlier_think_blocks_keeps_them_as_sampled(manager: ToolManager) -> None:
    tok = ThinkStrippingTokenizer()
    ep = await Environment(manager=manager, tokenizer=tok).run_episode(
        make_task(), ScriptedSampler(tok, SCRIPT)
    )
    assert (ep.valid, ep.stop_reason, ep.metrics["template_drift"]) == (True, "answer", 0.0)
    assert "<think>multiply first</think>" in tok.decode(ep.token_ids)
    # Each environment stretch is what the template renders after the turn just sampled.
    tools = list(Environment(manager=manager, tokenizer=tok).tool_access(make_task()).schemas)
    turns = [i for i, m in enumerate(ep.messages) if m["role"] == "assistant"]
    expected = tok.encode(tok.apply_chat_template(ep.messages[:1], tools=tools, add_generation_prompt=True))
    for n, text in enumerate(SCRIPT):
        expected += [*tok.encode(text), tok.eos_token_id]
        if n + 1 < len(turns):
            # The conversation up to the next turn, without its generation prompt: the last assistant header is
            # the turn just sampled; then the generation prompt is added back.
            rendered = tok.apply_chat_template(ep.messages[: turns[n + 1]], tools=tools)
            expected += tok.encode(after_last_turn(rendered, "<|im_start|>assistant", "<|im_end|>"))
            expected += tok.encode("<|im_start|>assistant\n")
    assert ep.token_ids == expected


async def test_template_drift_is_detected_and_the_episode_invalid(manager: ToolManager) -> None:
    tok = CountingTokenizer()
    ep = await Environment(manager=manager, tokenizer=tok).run_episode(
        make_task(), ScriptedSampler(tok, SCRIPT)
    )
    assert (ep.valid, ep.stop_reason) == (False, "template_drift")
    assert ep.error is not None
    assert "held '0 later)" in ep.error
    assert "rendered '2 later)" in ep.error


async def test_template_drift_report_mode_keeps_sampled_ids_and_counts(manager: ToolManager) -> None:
    tok = CountingTokenizer()
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(on_template_drift="report"))
    ep = await env.run_episode(make_task(), ScriptedSampler(tok, SCRIPT))
    assert ep.valid
    assert ep.success
    assert ep.metrics["template_drift"] == 2
    held = tok.decode(ep.token_ids)
    assert "(0 later)" in held
    assert "(2 later)" not in held
    # The environment's suffixes are still what the template appends: the text stays well formed.
    assert held.count("<|im_start|>assistant\n") == 3
    assert held.count("<tool_response>") == 3


def test_transcript_raises_template_drift_error_directly() -> None:
    tok = CountingTokenizer()
    transcript = Transcript(tok)
    transcript.start([{"role": "user", "content": "hi"}], tools=None)
    ids = [*tok.encode("<think>x</think>ok"), 2]
    transcript.add_sampled(
        ScriptedCompletion(token_ids=ids, logprobs=[0.0] * len(ids), text="", finish_reason="stop")
    )
    with pytest.raises(TemplateDriftError) as info:
        transcript.env_suffix([{"role": "user", "content": "again"}])
    assert info.value.expected.startswith("0 later")
    assert info.value.rendered.startswith("2 later")
