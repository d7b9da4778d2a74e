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

        async def sample(self, prompt_ids: Any, *, max_new_tokens: int) -> ScriptedCompletion:
            ids = [*CharTokenizer().encode("13.5"), 2]
            return ScriptedCompletion(token_ids=ids, logprobs=[-1.0] * 5, text="13.5", finish_reason="stop")

    tok = CharTokenizer()
    ep = await Environment(manager=manager, tokenizer=tok).run_episode(make_task(), Noncanonical())
    assert ep.token_ids[ep.prompt_length :] == [*tok.encode("13.5"), 2]
    assert ep.success


class ThinkStrippingTokenizer(CharTokenizer):
    """A template that drops think blocks of earlier assistant turns (as some Qwen3 templates do)."""

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
            if m["role"] == "assistant"
            else m
            for m in conversation
        ]
        text = render_qwen_style(cleaned, tools=tools, add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text


async def test_template_drift_is_detected_and_the_episode_invalid(manager: ToolManager) -> None:
    tok = ThinkStrippingTokenizer()
    ep = await Environment(manager=manager, tokenizer=tok).run_episode(
        make_task(), ScriptedSampler(tok, SCRIPT)
    )
    assert (ep.valid, ep.stop_reason) == (False, "template_drift")
    assert ep.error is not None
    assert "hink>multiply first" in ep.error


async def test_template_drift_report_mode_keeps_sampled_ids_and_counts(manager: ToolManager) -> None:
    tok = ThinkStrippingTokenizer()
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(on_template_drift="report"))
    ep = await env.run_episode(make_task(), ScriptedSampler(tok, SCRIPT))
    assert ep.valid
    assert ep.success
    assert ep.metrics["template_drift"] == 2
    assert "<think>multiply first</think>" in tok.decode(ep.token_ids)
    # The environment's suffixes are still what the template appends: the text stays well formed.
    assert tok.decode(ep.token_ids).count("<|im_start|>assistant\n") == 3


def test_transcript_raises_template_drift_error_directly() -> None:
    tok = ThinkStrippingTokenizer()
    transcript = Transcript(tok)
    transcript.start([{"role": "user", "content": "hi"}], tools=None)
    ids = [*tok.encode("<think>x</think>ok"), 2]
    transcript.add_sampled(
        ScriptedCompletion(token_ids=ids, logprobs=[0.0] * len(ids), text="", finish_reason="stop")
    )
    with pytest.raises(TemplateDriftError) as info:
        transcript.env_suffix([{"role": "user", "content": "again"}])
    assert info.value.expected.startswith("<think>")
