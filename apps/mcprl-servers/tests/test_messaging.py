from __future__ import annotations

import json
import sys
from typing import cast

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, RequestParamsMeta, TextContent

from mcprl_servers.messaging import build_server
from mcprl_servers.workspace_seed import SEED_CHANNELS, SEED_MESSAGES, SEED_USERS

pytestmark = pytest.mark.anyio


def _text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


def _meta(episode: str) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {"mcprl/episode_id": episode})


async def _read(
    client: Client, channel: str, episode: str | None = None, limit: int = 100
) -> list[dict[str, str]]:
    meta = _meta(episode) if episode is not None else None
    result = await client.call_tool("read_messages", {"channel": channel, "limit": limit}, meta=meta)
    assert not result.is_error, _text(result)
    return json.loads(_text(result))["messages"]


def _seed_texts(channel: str) -> list[str]:
    return [text for ch, _, _, text in sorted(SEED_MESSAGES, key=lambda m: m[2]) if ch == channel]


async def test_lists_channels_and_users_of_the_seed() -> None:
    async with Client(build_server()) as client:
        channels = json.loads(_text(await client.call_tool("list_channels", {})))["channels"]
        assert sorted(c["name"] for c in channels) == sorted(c[0] for c in SEED_CHANNELS)
        users = json.loads(_text(await client.call_tool("list_users", {})))["users"]
        assert sorted(u["name"] for u in users) == sorted(u[0] for u in SEED_USERS)


async def test_fresh_episode_sees_exactly_the_seed_messages() -> None:
    async with Client(build_server()) as client:
        messages = await _read(client, "general", "fresh")
        assert [m["text"] for m in messages] == _seed_texts("general")


async def test_post_is_visible_to_its_episode_only() -> None:
    async with Client(build_server()) as client:
        posted = await client.call_tool(
            "post_message",
            {"channel": "#markets", "text": "HLDR: 49.53"},
            meta=_meta("ep-a"),
        )
        assert json.loads(_text(posted)) == {"ok": True, "channel": "markets"}
        mine = await _read(client, "markets", "ep-a")
        assert mine[-1] == {"user": "agent", "text": "HLDR: 49.53"}
        assert all("49.53" not in m["text"] for m in await _read(client, "markets", "ep-b"))
        assert all("49.53" not in m["text"] for m in await _read(client, "markets"))


async def test_missing_episode_id_uses_the_shared_default_state() -> None:
    async with Client(build_server()) as client:
        await client.call_tool("post_message", {"channel": "general", "text": "hello default"})
        assert (await _read(client, "general"))[-1]["text"] == "hello default"
        assert (await _read(client, "general", "default"))[-1]["text"] == "hello default"


async def test_read_limit_keeps_the_most_recent_messages_oldest_first() -> None:
    async with Client(build_server()) as client:
        for i in range(3):
            await client.call_tool(
                "post_message", {"channel": "random", "text": f"note {i}"}, meta=_meta("e")
            )
        messages = await _read(client, "random", "e", limit=2)
        assert [m["text"] for m in messages] == ["note 1", "note 2"]


async def test_search_messages_matches_all_words_within_the_episode() -> None:
    async with Client(build_server()) as client:
        await client.call_tool(
            "post_message", {"channel": "support", "text": "ticket closed"}, meta=_meta("s1")
        )
        found = json.loads(
            _text(await client.call_tool("search_messages", {"query": "Ticket 4512"}, meta=_meta("s2")))
        )
        assert len(found["matches"]) == 2
        assert all("4512" in m["text"] for m in found["matches"])
        other = json.loads(
            _text(await client.call_tool("search_messages", {"query": "closed"}, meta=_meta("s2")))
        )
        assert other["matches"] == []


@pytest.mark.parametrize(
    ("tool", "arguments", "reason"),
    [
        ("post_message", {"channel": "nope", "text": "x"}, "Unknown channel '#nope'"),
        ("post_message", {"channel": "general", "text": "   "}, "must not be empty"),
        ("post_message", {"channel": "general", "text": "x" * 5000}, "too long"),
        ("read_messages", {"channel": "general", "limit": 0}, "between 1 and 100"),
        ("search_messages", {"query": " "}, "must not be empty"),
    ],
)
async def test_bad_requests_are_tool_errors(tool: str, arguments: dict[str, object], reason: str) -> None:
    async with Client(build_server()) as client:
        result = await client.call_tool(tool, arguments)
        assert result.is_error
        assert reason in _text(result)


async def _episode(client: Client, episode: str, rounds: int, seen: dict[str, list[str]]) -> None:
    for i in range(rounds):
        await client.call_tool(
            "post_message",
            {"channel": "trading", "text": f"{episode} says {i}"},
            meta=_meta(episode),
        )
        await anyio.lowlevel.checkpoint()
    seen[episode] = [m["text"] for m in await _read(client, "trading", episode)]


async def _check_isolation(client: Client, n_episodes: int, rounds: int) -> None:
    seen: dict[str, list[str]] = {}
    async with anyio.create_task_group() as tg:
        for e in range(n_episodes):
            tg.start_soon(_episode, client, f"ep-{e}", rounds, seen)
    seed = _seed_texts("trading")
    for e in range(n_episodes):
        episode = f"ep-{e}"
        assert seen[episode] == seed + [f"{episode} says {i}" for i in range(rounds)]
    assert await _read(client, "trading", "never-posted") == [
        {"user": u, "text": t} for ch, u, _, t in sorted(SEED_MESSAGES, key=lambda m: m[2]) if ch == "trading"
    ]


async def test_concurrent_episodes_never_see_each_others_posts() -> None:
    async with Client(build_server()) as client:
        with anyio.fail_after(30):
            await _check_isolation(client, n_episodes=256, rounds=2)


async def test_concurrent_episodes_are_isolated_over_stdio() -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcprl_servers.messaging"])
    with anyio.fail_after(60):
        async with Client(params) as client:
            await _check_isolation(client, n_episodes=16, rounds=3)
