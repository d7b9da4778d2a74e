"""Record/replay: a recording replays in a different run (other episode ids, order), misses are infra errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
import structlog
import structlog.testing
from mcp.server.mcpserver import Context, MCPServer
from tools_testkit import make_server

from mcprl_tools import CassetteError, ServersConfig, ToolManager, ToolResult

pytestmark = pytest.mark.anyio

HEADER = '{"type": "catalogue", "version": 2, "tools": [], "servers": {}}'


def make_notebook() -> MCPServer:
    """A stateful server: each episode (the request's `mcprl/episode_id`) has its own list of notes."""
    server = MCPServer("notebook")
    notes: dict[str, list[str]] = {}

    @server.tool(description="Append a note; returns every note of the episode so far.")
    def write(ctx: Context, text: str) -> str:
        meta: Any = ctx.request_context.meta or {}
        book = notes.setdefault(str(meta.get("mcprl/episode_id")), [])
        book.append(text)
        return ",".join(book)

    return server


def without_latency(results: list[ToolResult]) -> list[ToolResult]:
    return [attrs.evolve(r, latency_s=0.0) for r in results]


async def test_a_different_run_replays_stateless_calls_by_arguments(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    async with ToolManager.in_memory({"calc": make_server("calc")}, stateful=False, record=cassette) as rec:
        schemas = rec.tool_schemas()
        recorded = [
            await rec.call("add", {"a": 1, "b": 2}, episode_id="step-1/t1/0"),
            await rec.call("fail", {"message": "nope"}, episode_id="step-1/t1/0"),
            await rec.call("echo", {"text": "hi"}, episode_id="step-1/t2/1"),
        ]
    # A replayed call waits in no server's queue, whatever the recorded one waited.
    recorded = [attrs.evolve(r, queue_s=0.0) for r in recorded]
    async with ToolManager.replay(cassette) as replay:
        assert replay.tool_schemas() == schemas
        # Other episode ids, another order, a key asked again, arguments in another key order.
        replayed = [
            await replay.call("echo", {"text": "hi"}, episode_id="eval-step-4/t2/0"),
            await replay.call("add", {"b": 2, "a": 1}, episode_id="other/t1/3"),
            await replay.call("add", {"a": 1, "b": 2}),
            await replay.call("fail", {"message": "nope"}, episode_id="x"),
        ]
        assert replay.step_metrics()["tools/replay/hits"] == 4
    assert replayed[0] == recorded[2]
    assert replayed[1] == replayed[2] == recorded[0]
    assert replayed[3] == recorded[1]
    assert [r.kind for r in replayed] == ["ok", "ok", "ok", "tool_error"]


async def test_a_key_recorded_several_times_serves_them_in_order_then_repeats_the_last(
    tmp_path: Path,
) -> None:
    cassette = tmp_path / "calls.jsonl"
    tool = {"name": "t", "server": "s", "tool": "t", "description": "", "input_schema": {"type": "object"}}
    lines = [
        {"type": "catalogue", "version": 2, "tools": [tool], "servers": {"s": {"stateful": False}}},
        *(
            {
                "type": "call",
                "server": "s",
                "tool": "t",
                "arguments": {"q": 1},
                "history": None,
                "episode_id": None,
                "result": {"kind": "ok", "text": text, "name": "t", "server": "s"},
            }
            for text in ("first", "second")
        ),
    ]
    cassette.write_text("".join(json.dumps(line) + "\n" for line in lines))
    async with ToolManager.replay(cassette) as replay:
        texts = [(await replay.call("t", {"q": 1})).text for _ in range(4)]
    assert texts == ["first", "second", "second", "second"]


async def test_results_recorded_across_a_restart_replay_as_one_session(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    tool = {"name": "t", "server": "s", "tool": "t", "description": "", "input_schema": {"type": "object"}}
    result = {"kind": "ok", "text": "x", "name": "t", "server": "s", "generation": 3, "stateful": True}
    lines = [
        {"type": "catalogue", "version": 2, "tools": [tool], "servers": {"s": {"stateful": True}}},
        {
            "type": "call",
            "server": "s",
            "tool": "t",
            "arguments": {},
            "history": "",
            "episode_id": "e",
            "result": result,
        },
    ]
    cassette.write_text("".join(json.dumps(line) + "\n" for line in lines))
    async with ToolManager.replay(cassette) as replay:
        served = await replay.call("s.t", {}, episode_id="another")
    assert (served.text, served.generation, served.name) == ("x", 1, "s.t")


async def test_a_stateful_call_replays_only_after_the_same_earlier_calls(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    async with ToolManager.in_memory({"notebook": make_notebook()}, record=cassette) as rec:
        assert (await rec.call("write", {"text": "a"}, episode_id="run1/e")).text == "a"
        assert (await rec.call("write", {"text": "b"}, episode_id="run1/e")).text == "a,b"
    report = tmp_path / "misses.jsonl"
    async with ToolManager.replay(cassette, miss_report=report) as replay:
        first = await replay.call("write", {"text": "a"}, episode_id="run2/e")
        second = await replay.call("write", {"text": "b"}, episode_id="run2/e")
        # Another episode writes "b" first: its notebook would hold only "b", which was never recorded.
        other = await replay.call("write", {"text": "b"}, episode_id="run2/f")
        metrics = replay.step_metrics()
    assert (first.text, second.text) == ("a", "a,b")
    assert other.is_infra_error
    assert other.error_type == "replay_miss"
    assert metrics["tools/replay/hits"] == 2
    assert metrics["tools/replay/misses"] == 1
    assert metrics["tools/step/infra_errors"] == 1
    [missed] = [json.loads(line) for line in report.read_text().splitlines()]
    assert missed["tool"] == "notebook.write"
    assert missed["episode_id"] == "run2/f"
    assert missed["arguments"] == '{"text":"b"}'


async def test_a_miss_is_an_infra_error_result_not_an_exception(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    async with ToolManager.in_memory({"calc": make_server("calc")}, stateful=False, record=cassette) as rec:
        await rec.call("add", {"a": 1, "b": 2})
    report = tmp_path / "run" / "replay_misses.jsonl"
    with structlog.testing.capture_logs() as logs:
        async with ToolManager.replay(cassette, miss_report=report) as replay:
            missed = await replay.call("add", {"a": 2, "b": 2}, episode_id="step-3/t9/1")
            assert replay.step_metrics()["tools/replay/misses"] == 1
            assert replay.step_metrics()["tools/replay/misses"] == 0  # per step
    [summary] = [e for e in logs if e["event"] == "cassette_replayed"]
    assert (summary["hits"], summary["misses"], summary["report"]) == (0, 1, str(report))
    assert missed.kind == "infra_error"
    assert f"cassette {cassette} holds no such call" in missed.text
    assert json.loads(report.read_text())["episode_id"] == "step-3/t9/1"


async def test_local_rejections_are_recomputed_on_replay_not_missed(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    calls: list[tuple[str, dict[str, Any]]] = [("missing", {}), ("add", {"a": 1})]
    async with ToolManager.in_memory({"calc": make_server("calc")}, stateful=False, record=cassette) as rec:
        recorded = [await rec.call(n, a) for n, a in calls]
    assert len(cassette.read_text().splitlines()) == 1  # only the catalogue: nothing reached the server
    async with ToolManager.replay(cassette) as replay:
        replayed = [await replay.call(n, a) for n, a in calls]
        assert replay.step_metrics()["tools/replay/misses"] == 0
    assert without_latency(replayed) == without_latency(recorded)
    assert [r.error_type for r in replayed] == ["unknown_tool", "invalid_arguments"]


def test_record_and_replay_together_are_refused(tmp_path: Path) -> None:
    config = ServersConfig(servers={}, source="<test>")
    with pytest.raises(ValueError, match="exclusive"):
        ToolManager(config, record=tmp_path / "a.jsonl", replay=tmp_path / "b.jsonl")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (f'{HEADER}\n{{"type": "call"\n', r"bad\.jsonl:2: malformed cassette line"),
        ("", r"bad\.jsonl:1: empty cassette"),
        (
            '{"type": "catalogue", "tools": []}\n'
            '{"type": "call", "name": "add", "arguments": {}, "episode_id": "e", "result": {}}\n',
            r"bad\.jsonl:1: cassette format version 1 \(keyed by episode id\) .* record it again",
        ),
        ('{"type": "call"}\n', r"bad\.jsonl:1: expected the catalogue line first"),
        (f"{HEADER}\n[1]\n", r"bad\.jsonl:2: malformed"),
        (f"{HEADER}\n{HEADER}\n", r"bad\.jsonl:2: a second catalogue line"),
    ],
)
def test_a_bad_cassette_names_the_file_and_line(tmp_path: Path, text: str, message: str) -> None:
    cassette = tmp_path / "bad.jsonl"
    cassette.write_text(text)
    with pytest.raises(CassetteError, match=message):
        ToolManager.replay(cassette)


def test_a_missing_cassette_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CassetteError, match=r"nope\.jsonl: cannot read cassette"):
        ToolManager.replay(tmp_path / "nope.jsonl")


async def test_recording_again_appends_under_the_same_catalogue_and_refuses_another(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    for a in (1, 2):
        async with ToolManager.in_memory(
            {"calc": make_server("calc")}, stateful=False, record=cassette
        ) as rec:
            await rec.call("add", {"a": a, "b": 2})
    async with ToolManager.replay(cassette) as replay:
        assert [(await replay.call("add", {"a": a, "b": 2})).text for a in (1, 2)] == ["3", "4"]
    with pytest.raises(CassetteError, match=r"calls\.jsonl:1: holds a cassette of another tool catalogue"):
        async with ToolManager.in_memory({"other": make_server("other")}, record=cassette):
            pass


async def test_a_replay_exposes_only_what_its_own_config_allows(tmp_path: Path) -> None:
    cassette = tmp_path / "calls.jsonl"
    servers = {"calc": make_server("calc"), "other": make_server("other")}
    async with ToolManager.in_memory(servers, record=cassette) as rec:
        assert "calc.add" in {t.name for t in rec.tools}  # both servers have `add`: namespaced
    narrowed = ServersConfig.from_dict(
        {"mcpServers": {"calc": {"command": "unused-in-replay", "allow_tools": ["add", "echo"]}}},
        source="<t>",
    )
    async with ToolManager(narrowed, replay=cassette) as replay:
        assert sorted(t.name for t in replay.tools) == ["add", "echo"]  # no collision left: own names
        unknown = await replay.call("other.add", {"a": 1, "b": 2})
    assert unknown.error_type == "unknown_tool"
