from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any, cast

import anyio
import pytest
from mcp import Client
from mcp.types import RequestParamsMeta, TextContent

from mcprl_servers import calculator, finance, messaging, python_sandbox, search
from mcprl_tasks import FAMILIES, demo_succeeds, ideal_demo, imperfect_teacher, load_preset, read_tasks
from mcprl_tasks.errors import TasksError
from mcprl_tasks.toolsim import simulate_tool_error

_TOOL_SERVER = {
    "get_quote": "finance",
    "search_symbols": "finance",
    "get_profile": "finance",
    "calculate": "calculator",
    "search": "search",
    "fetch_document": "search",
    "run_python": "python",
    "list_channels": "messaging",
    "list_users": "messaging",
    "post_message": "messaging",
    "read_messages": "messaging",
    "search_messages": "messaging",
}


def _meta(episode: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {"mcprl/episode_id": episode})


def _sample(preset: str, n: int, seed: int = 0) -> list[dict[str, Any]]:
    train, val = load_preset(preset)
    tasks = read_tasks(train) + read_tasks(val)
    return random.Random(seed).sample(tasks, n)


def _calls(messages: list[dict[str, Any]]) -> list[tuple[dict[str, Any], str]]:
    """(tool call, tool result) pairs of a script."""
    out = []
    for i, message in enumerate(messages):
        if message["role"] == "assistant" and message.get("tool_calls"):
            (call,) = message["tool_calls"]
            assert call["type"] == "function"
            assert message["content"] == ""
            assert messages[i + 1]["role"] == "tool"
            assert messages[i + 1]["name"] == call["function"]["name"]
            out.append((call["function"], messages[i + 1]["content"]))
    return out


@asynccontextmanager
async def _clients() -> AsyncIterator[dict[str, Client]]:
    async with AsyncExitStack() as stack:
        servers = {
            "finance": finance,
            "calculator": calculator,
            "messaging": messaging,
            "search": search,
            "python": python_sandbox,
        }
        yield {name: await stack.enter_async_context(Client(m.build_server())) for name, m in servers.items()}


def test_ideal_demos_solve_every_shipped_task() -> None:
    for preset in ("demo", "default"):
        for path in load_preset(preset):
            for task in read_tasks(path):
                messages = ideal_demo(task)
                assert demo_succeeds(task, messages), task["id"]
                assert len(_calls(messages)) == task["metadata"]["min_tool_calls"]


def test_demo_shape_is_user_then_tool_calls_then_answer() -> None:
    task = next(t for t in _sample("demo", 200) if t["metadata"]["family"] == "quote_mul")
    messages = ideal_demo(task)
    assert messages[0] == {"role": "user", "content": task["prompt"]}
    assert [m["role"] for m in messages[1:]] == ["assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[-1]["content"] == f"<answer>{task['answer']}</answer>"


@pytest.mark.anyio
@pytest.mark.parametrize("preset", ["demo", "default"])
async def test_ideal_demos_replayed_through_the_real_servers_reach_the_answer(preset: str) -> None:
    tasks = _sample(preset, 60)
    if preset == "default":  # make sure every family, and python-computed ratios, are replayed
        pool = read_tasks(load_preset(preset)[0])
        tasks += [next(t for t in pool if t["metadata"]["family"] == f) for f in FAMILIES]
        tasks += [t for t in pool if "python" in t["servers"]][:3]
    with anyio.fail_after(60):
        async with _clients() as clients:
            for n, task in enumerate(tasks):
                episode = f"demo-{preset}-{n}"
                messages = ideal_demo(task)
                for call, expected in _calls(messages):
                    result = await clients[_TOOL_SERVER[call["name"]]].call_tool(
                        call["name"],
                        call["arguments"],
                        meta=_meta(episode),
                    )
                    (content,) = result.content
                    assert isinstance(content, TextContent)
                    if call["name"] == "run_python" and "sandbox unavailable" in content.text:
                        continue  # isolation cannot be set up on this host: the tool refuses to run code
                    assert not result.is_error, content.text
                    assert content.text == expected, (task["id"], call)
                checker = task["checker"]
                if checker["type"] == "message_posted":
                    read = await clients["messaging"].call_tool(
                        "read_messages",
                        {"channel": checker["channel"], "limit": 100},
                        meta=_meta(episode),
                    )
                    (content,) = read.content
                    assert isinstance(content, TextContent)
                    texts = [m["text"] for m in json.loads(content.text)["messages"]]
                    assert any(checker["contains"] in t for t in texts)
                    assert messages[-1]["content"] == f"<answer>{task['answer']}</answer>"


def test_imperfect_teacher_succeeds_about_half_the_time_on_the_demo_preset() -> None:
    tasks = read_tasks(load_preset("demo")[0])
    rng = random.Random(0)
    rate = sum(demo_succeeds(t, imperfect_teacher(t, rng)) for t in tasks) / len(tasks)
    assert 0.5 <= rate <= 0.62


def test_imperfect_teacher_makes_each_kind_of_mistake_reproducibly() -> None:
    tasks = _sample("demo", 400)
    first = [imperfect_teacher(t, random.Random(i)) for i, t in enumerate(tasks)]
    again = [imperfect_teacher(t, random.Random(i)) for i, t in enumerate(tasks)]
    assert first == again
    lengths = [len(_calls(m)) - t["metadata"]["min_tool_calls"] for t, m in zip(tasks, first, strict=True)]
    assert any(d < 0 for d in lengths)  # skipped a lookup
    assert any(d > 0 for d in lengths)  # needless call
    wrong_but_complete = [
        t for t, m, d in zip(tasks, first, lengths, strict=True) if d >= 0 and not demo_succeeds(t, m)
    ]
    assert wrong_but_complete  # answered wrongly despite looking everything up


def test_perfect_settings_reproduce_the_ideal_demo() -> None:
    for task in _sample("default", 50):
        clean = imperfect_teacher(
            task, random.Random(0), p_skip_lookup=0.0, p_extra_call=0.0, p_wrong_answer=0.0
        )
        assert clean == ideal_demo(task)


def test_probabilities_outside_the_unit_interval_are_refused() -> None:
    task = _sample("demo", 1)[0]
    with pytest.raises(ValueError, match="probabilities"):
        imperfect_teacher(task, random.Random(0), p_skip_lookup=1.5)


def _typo_demos(n: int) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    out = []
    for i, task in enumerate(_sample("demo", n)):
        messages = imperfect_teacher(task, random.Random(i), p_typo=1.0)
        if any(m["role"] == "tool" and "Unknown symbol" in m["content"] for m in messages):
            out.append((task, messages))
    return out


def test_a_mistyped_ticker_is_retried_with_the_task_s_ticker() -> None:
    demos = _typo_demos(200)
    assert len(demos) > 100  # every demo that looks a ticker up mistypes one (at most once)
    for task, messages in demos:
        calls = _calls(messages)
        errors = [i for i, (_, result) in enumerate(calls) if result.startswith("Error executing tool")]
        assert len(errors) == 1, task["id"]
        typo = calls[errors[0]][0]["arguments"]["symbol"]
        retry = calls[errors[0] + 1][0]
        assert typo not in task["metadata"]["params"]["symbols"]
        assert retry == {"name": "get_quote", "arguments": {"symbol": retry["arguments"]["symbol"]}}
        assert retry["arguments"]["symbol"] in task["metadata"]["params"]["symbols"]
        assert sum(a != b for a, b in zip(typo, retry["arguments"]["symbol"], strict=True)) == 1
        # The mistyped call is context, not a target: only it carries weight 0.
        weighted = [m for m in messages if "weight" in m]
        assert [(m["role"], m["weight"]) for m in weighted] == [("assistant", 0)]
        assert weighted[0]["tool_calls"][0]["function"]["arguments"] == {"symbol": typo}


@pytest.mark.anyio
async def test_mistyped_lookups_replayed_through_the_real_server_get_the_same_error() -> None:
    demos = _typo_demos(40)
    with anyio.fail_after(60):
        async with _clients() as clients:
            for task, messages in demos:
                for call, expected in _calls(messages):
                    if call["name"] != "get_quote":
                        continue
                    result = await clients["finance"].call_tool(call["name"], call["arguments"])
                    (content,) = result.content
                    assert isinstance(content, TextContent)
                    assert content.text == expected, task["id"]
                    assert result.is_error == expected.startswith("Error executing tool")


def test_typos_leave_the_other_mistakes_of_a_seed_alone_when_off() -> None:
    for i, task in enumerate(_sample("demo", 50)):
        assert imperfect_teacher(task, random.Random(i), p_typo=0.0) == imperfect_teacher(
            task, random.Random(i)
        )
    with pytest.raises(TasksError, match="no error to simulate"):
        simulate_tool_error(
            "get_quote", {"symbol": _sample("demo", 1)[0]["metadata"]["params"]["symbols"][0]}
        )


def test_with_reasoning_states_each_turns_own_action_and_keeps_the_rest() -> None:
    from mcprl_tasks import with_reasoning

    call = {"type": "function", "function": {"name": "get_quote", "arguments": {"symbol": "ACME"}}}
    messages = [
        {"role": "user", "content": "Price of ACME?"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "get_quote", "content": '{"price": 12.5}'},
        {"role": "assistant", "content": "<answer>12.5</answer>"},
        {"role": "assistant", "content": "<answer>1</answer>", "reasoning_content": "Mine."},
    ]
    out = with_reasoning(messages)
    assert [m.get("reasoning_content") for m in out] == [
        None,
        'Next I call get_quote with {"symbol": "ACME"}.',
        None,
        "The tool results give the answer: 12.5.",
        "Mine.",
    ]
    assert [{k: v for k, v in m.items() if k != "reasoning_content"} for m in out[:4]] == messages[:4]
    assert "reasoning_content" not in messages[1]  # the input is not modified
