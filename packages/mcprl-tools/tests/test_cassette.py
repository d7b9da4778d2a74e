"""Record/replay: a recorded run replays exactly with no server running."""

from __future__ import annotations

from pathlib import Path

import pytest
from tools_testkit import make_server

from mcprl_tools import CassetteError, ToolManager

pytestmark = pytest.mark.anyio

CALLS = [
    ("add", {"a": 1, "b": 2}, "ep-1"),
    ("fail", {"message": "nope"}, "ep-1"),
    ("add", {"a": 1}, None),
    ("whoami", {}, "ep-2"),
    ("missing", {}, None),
    ("add", {"a": 1, "b": 2}, "ep-1"),
]


async def test_replay_reproduces_recorded_results_offline(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    async with ToolManager.in_memory({"calc": make_server("calc")}, record=cassette) as manager:
        recorded = [await manager.call(n, a, episode_id=e) for n, a, e in CALLS]
        schemas = manager.tool_schemas()
    async with ToolManager.replay(cassette) as replay:
        assert replay.tool_schemas() == schemas
        replayed = [await replay.call(n, a, episode_id=e) for n, a, e in CALLS]
    assert replayed == recorded
    assert [r.kind for r in replayed] == ["ok", "tool_error", "tool_error", "ok", "tool_error", "ok"]


async def test_replay_of_an_unrecorded_call_is_an_error(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    async with ToolManager.in_memory({"calc": make_server("calc")}, record=cassette) as manager:
        await manager.call("add", {"a": 1, "b": 2})
    async with ToolManager.replay(cassette) as replay:
        await replay.call("add", {"a": 1, "b": 2})
        with pytest.raises(CassetteError, match="no recorded call add"):
            await replay.call("add", {"a": 1, "b": 2})


def test_malformed_cassette_names_the_line(tmp_path: Path) -> None:
    cassette = tmp_path / "bad.jsonl"
    cassette.write_text('{"type": "catalogue", "tools": []}\n{"type": "call"\n')
    with pytest.raises(CassetteError, match=r"bad\.jsonl:2: malformed"):
        ToolManager.replay(cassette)
