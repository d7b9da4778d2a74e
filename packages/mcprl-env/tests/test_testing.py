"""The shipped test doubles behave like the real thing."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcprl_env import ChatTokenizer
from mcprl_env.testing import CharTokenizer, ScriptedSampler

pytestmark = pytest.mark.anyio


@given(st.text())
def test_char_tokenizer_round_trips_text(text: str) -> None:
    tok = CharTokenizer()
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_are_atomic_and_skippable() -> None:
    tok = CharTokenizer()
    ids = tok.encode("<|im_start|>hi<|im_end|>")
    assert ids == [1, *tok.encode("hi"), 2]
    assert tok.decode(ids, skip_special_tokens=True) == "hi"
    tok_typed: ChatTokenizer = tok
    assert tok_typed.eos_token_id == 2


async def test_scripted_sampler_picks_the_turn_from_the_prompt_and_cuts_at_the_limit() -> None:
    tok = CharTokenizer()
    sampler = ScriptedSampler(tok, ["first", "second"], logprob=-2.0)
    prompt = tok.encode(
        tok.apply_chat_template([{"role": "user", "content": "q"}], add_generation_prompt=True)
    )
    one = await sampler.sample(prompt, max_new_tokens=100)
    assert (one.text, one.finish_reason, one.token_ids[-1]) == ("first", "stop", 2)
    assert one.logprobs == [-2.0] * 6
    convo = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "first"},
        {"role": "user", "content": "more"},
    ]
    prompt2 = tok.encode(tok.apply_chat_template(convo, add_generation_prompt=True))
    assert (await sampler.sample(prompt2, max_new_tokens=100)).text == "second"
    cut = await sampler.sample(prompt, max_new_tokens=3)
    assert (cut.text, cut.finish_reason) == ("fir", "length")
    assert len(sampler.calls) == 3


def test_scripted_sampler_needs_a_script() -> None:
    with pytest.raises(ValueError, match="at least one"):
        ScriptedSampler(CharTokenizer(), [])
