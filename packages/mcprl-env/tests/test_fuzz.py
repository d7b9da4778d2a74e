"""RELIABILITY scenario 9: fuzzed tool calls through parse + step.

Each generated completion mixes well-formed calls, calls the manager rejects and malformed blocks of every kind
(invalid JSON, wrong types, missing/extra keys, bodies over the size limit, wrong or nested tags). Every episode must finish
without an unhandled exception, stay valid (model faults are data, not infrastructure errors) and count exactly
what was injected.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from env_testkit import call, make_task
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mcprl_env import EnvConfig, Environment, HermesToolCallParser
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio

filler = st.text(alphabet=st.characters(blacklist_characters="<", blacklist_categories=("Cs",)), max_size=30)
junk = st.text(
    alphabet=st.characters(blacklist_characters='<{}[]"', blacklist_categories=("Cs",)),
    min_size=1,
    max_size=30,
)
numbers = st.integers(-1000, 1000) | st.floats(-1e6, 1e6, allow_nan=False)

# (text, counter key) — keys are the episode metric names each segment must increment.
segments = st.one_of(
    st.builds(lambda a, b: (call("multiply", a=a, b=b), "tool_calls_ok"), numbers, numbers),
    st.builds(
        lambda n: (call(n, x=1), "tool_errors/unknown_tool"), st.from_regex(r"zz_[a-z]{1,8}", fullmatch=True)
    ),
    st.builds(
        lambda v: (call("multiply", a=v), "tool_errors/invalid_arguments"), st.text(max_size=5) | st.none()
    ),
    st.builds(lambda b: (call("divide", a=1, b=b), "tool_errors/tool_error"), st.just(0)),
    st.builds(lambda t: (f"<tool_call>@{t}</tool_call>", "parse_errors/invalid_json"), junk),
    st.builds(
        lambda v: (f"<tool_call>{json.dumps(v)}</tool_call>", "parse_errors/not_an_object"),
        st.lists(numbers, max_size=3) | numbers,
    ),
    st.builds(
        lambda a: (f"<tool_call>{json.dumps({'arguments': a})}</tool_call>", "parse_errors/missing_name"),
        st.dictionaries(st.text(max_size=4), numbers, max_size=2),
    ),
    st.builds(
        lambda a: (
            f"<tool_call>{json.dumps({'name': 'multiply', 'arguments': a})}</tool_call>",
            "parse_errors/invalid_arguments",
        ),
        st.lists(numbers, max_size=2) | numbers,
    ),
    st.builds(
        lambda k: (
            f"<tool_call>{json.dumps({'name': 'multiply', 'arguments': {}, k: 1})}</tool_call>",
            "parse_errors/unexpected_keys",
        ),
        st.sampled_from(["id", "args", "tool", "extra"]),
    ),
    st.just(("</tool_call>", "parse_errors/unopened_tag")),
    st.just((f"<tool_call>{call('multiply', a=1, b=2)}</tool_call>", "parse_errors/nested_tag")),
    st.just(("<tool_call>   </tool_call>", "parse_errors/empty_call")),
    st.just((call("big", n=1, char="x" * 3_000), "parse_errors/too_large")),
)


@st.composite
def turns(draw: st.DrawFn) -> tuple[list[str], Counter[str]]:
    injected: Counter[str] = Counter()
    texts: list[str] = []
    for _ in range(draw(st.integers(1, 5))):
        parts = draw(st.lists(segments, min_size=1, max_size=4))
        text = ""
        for seg_text, key in parts:
            text += draw(filler) + seg_text
            injected[key] += 1
        if draw(st.booleans()):
            text += draw(filler) + "<tool_call>" + draw(junk)
            injected["parse_errors/unclosed_tag"] += 1
        texts.append(text + draw(filler))
    texts.append("<answer>done</answer>")
    return texts, injected


CONFIG = EnvConfig(
    max_total_tokens=1_000_000,
    max_new_tokens_per_turn=200_000,
    max_tool_calls=1000,
    max_calls_per_turn=100,
    max_consecutive_invalid=100,
    max_tool_output_tokens=64,
)


# 300 episodes of 2-6 turns: well over 1,000 fuzzed completions through parse + step.
@pytest.mark.slow
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(script=turns())
async def test_fuzzed_completions_are_counted_model_faults_never_crashes(
    manager: ToolManager, script: tuple[list[str], Counter[str]]
) -> None:
    texts, injected = script
    tok = CharTokenizer()
    env = Environment(
        manager=manager, tokenizer=tok, config=CONFIG, parser=HermesToolCallParser(max_call_chars=2000)
    )
    ep = await env.run_episode(make_task(max_turns=len(texts)), ScriptedSampler(tok, texts))
    assert ep.error is None
    assert (ep.valid, ep.stop_reason, ep.metrics["turns"]) == (True, "answer", len(texts))
    for key, count in injected.items():
        assert ep.metrics.get(key, 0.0) == count, key
    parse_total = sum(n for k, n in injected.items() if k.startswith("parse_errors/"))
    assert ep.metrics["parse_errors"] == parse_total
    assert ep.metrics["infra_errors"] == 0
    calls = sum(n for k, n in injected.items() if not k.startswith("parse_errors/"))
    assert ep.metrics["tool_calls"] == calls
    # Every block got exactly one observation: tool messages = calls + parse errors.
    assert sum(m["role"] == "tool" for m in ep.messages) == calls + parse_total
    # Token exactness holds whatever the model wrote; the episode serialises for trajectory files.
    tools = list(env.tool_access(make_task()).schemas)
    assert tok.decode(ep.token_ids) == tok.apply_chat_template(ep.messages, tools=tools).removesuffix("\n")
    assert sum(ep.loss_mask) == sum(len(t) + 1 for t in texts)
    json.dumps(ep.to_dict())


@settings(max_examples=1000, deadline=None)
@given(text=st.text(max_size=300) | st.lists(segments.map(lambda s: s[0]) | filler, max_size=6).map("".join))
def test_a_thousand_arbitrary_completions_parse_without_exceptions(text: str) -> None:
    turn = HermesToolCallParser().parse(text)
    assert len(turn.calls) + len(turn.errors) == len(turn.items)
    assert all(error.kind and error.reason for error in turn.errors)
