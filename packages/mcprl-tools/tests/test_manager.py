"""Call-path logic over in-memory servers: results, errors, names, meta, metrics, aliases, truncation."""

from __future__ import annotations

import anyio
import pytest
from tools_testkit import make_server

from mcprl_tools import ManagerNotStartedError, ToolManager, ToolResult, truncation_marker

pytestmark = pytest.mark.anyio


async def test_ok_call_returns_text_and_structured_content() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        result = await manager.call("add", {"a": 2, "b": 3})
    assert result.ok
    assert result.text == "5"
    assert result.structured == {"result": 5}
    assert result.server == "calc"
    assert result.error_type is None
    assert result.latency_s > 0


async def test_tool_error_is_the_models_fault() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        result = await manager.call("fail", {"message": "bad input"})
    assert result.kind == "tool_error"
    assert result.error_type == "tool_error"
    assert "bad input" in result.text
    assert not result.is_infra_error


async def test_unknown_tool_suggests_the_nearest_name() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        result = await manager.call("ad", {"a": 1, "b": 2})
    assert result.kind == "tool_error"
    assert result.error_type == "unknown_tool"
    assert result.server is None
    assert "'add'" in result.text


async def test_invalid_arguments_are_rejected_before_the_server() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        missing = await manager.call("add", {"a": 1})
        wrong_type = await manager.call("add", {"a": 1, "b": "two"})
        not_object = await manager.call("add", [1, 2])  # pyright: ignore[reportArgumentType]
        assert manager.metrics()["tools/errors/invalid_arguments"] == 3
    for result in (missing, wrong_type, not_object):
        assert result.kind == "tool_error"
        assert result.error_type == "invalid_arguments"
    assert "'b' is a required property" in missing.text
    assert "'two' is not of type 'integer'" in wrong_type.text


async def test_colliding_names_are_namespaced_and_server_tool_always_resolves() -> None:
    servers = {"a": make_server("a"), "b": make_server("b")}
    async with ToolManager.in_memory(servers, deny_tools=("add",)) as manager:
        names = {t.name for t in manager.tools}
        assert "a.echo" in names
        assert "b.echo" in names
        assert "echo" not in names
        assert "add" not in names
        assert "a.add" not in names
        via_b = await manager.call("b.echo", {"text": "hi"})
        unknown_plain = await manager.call("echo", {"text": "hi"})
    assert via_b.text == "b:hi"
    assert unknown_plain.error_type == "unknown_tool"


async def test_unique_names_also_resolve_as_server_dot_tool() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        assert "add" in {t.name for t in manager.tools}
        result = await manager.call("calc.add", {"a": 1, "b": 1})
    assert result.text == "2"


async def test_tool_schemas_are_in_function_tool_format() -> None:
    servers = {"a": make_server("a"), "b": make_server("b")}
    async with ToolManager.in_memory(servers) as manager:
        schemas = manager.tool_schemas()
        only_b = manager.tool_schemas(servers=["b"])
    add = next(s for s in schemas if s["function"]["name"] == "a.add")
    assert add["type"] == "function"
    assert add["function"]["description"] == "Add two integers."
    assert add["function"]["parameters"]["required"] == ["a", "b"]
    assert add["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert {s["function"]["name"].split(".")[0] for s in only_b} == {"b"}
    assert len(only_b) == len(schemas) // 2


async def test_episode_id_travels_in_request_meta() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        with_id = await manager.call("whoami", {}, episode_id="ep-42")
        without = await manager.call("whoami", {})
    assert with_id.text == "ep-42"
    assert without.text == "default"


async def test_argument_aliases_are_normalised() -> None:
    async with ToolManager.in_memory(
        {"calc": make_server("calc")}, aliases={"python_code": "code"}
    ) as manager:
        aliased = await manager.call("run_code", {"python_code": "print(1)"})
        both = await manager.call("run_code", {"code": "real", "python_code": "ignored"})
    assert aliased.text == "ran print(1)"
    # an alias never overwrites the canonical key given alongside it
    assert both.text == "ran real"


async def test_output_over_the_cap_is_truncated_with_a_marker() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}, output_cap_bytes=1000) as manager:
        small = await manager.call("big", {"n": 1000})
        large = await manager.call("big", {"n": 5_000_000})
        wide = await manager.call("big", {"n": 999, "char": "é"})
    assert not small.truncated
    assert small.text == "x" * 1000
    assert large.truncated
    assert large.text == "x" * 1000 + truncation_marker(4_999_000)
    assert wide.truncated
    assert wide.text == "é" * 500 + truncation_marker(2 * 999 - 1000)


async def test_call_timeout_is_an_infra_error() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}, call_timeout=0.2) as manager:
        with anyio.fail_after(5):
            result = await manager.call("nap", {"seconds": 30})
        after = await manager.call("add", {"a": 1, "b": 1})
    assert result.kind == "infra_error"
    assert result.error_type == "timeout"
    assert 0.2 <= result.latency_s < 1.0
    assert after.ok


async def test_metrics_count_calls_errors_and_latency() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}) as manager:
        for _ in range(3):
            await manager.call("add", {"a": 1, "b": 1})
        await manager.call("fail", {"message": "x"})
        await manager.call("nope", {})
        m = manager.metrics()
    assert m["tools/calls"] == 5
    assert m["tools/calc/calls"] == 4
    assert m["tools/errors/tool_error"] == 1
    assert m["tools/errors/unknown_tool"] == 1
    assert m["tools/tool/calc.add/calls"] == 3
    assert m["tools/calc/latency_p95_ms"] >= m["tools/calc/latency_p50_ms"] > 0
    assert m["tools/calc/restarts"] == 0
    assert m["tools/error_rate"] == pytest.approx(2 / 5)
    assert all(isinstance(v, float) for v in m.values())


async def test_using_the_manager_outside_its_block_raises() -> None:
    manager = ToolManager.in_memory({"calc": make_server("calc")})
    with pytest.raises(ManagerNotStartedError):
        await manager.call("add", {"a": 1, "b": 1})
    async with manager:
        pass
    with pytest.raises(ManagerNotStartedError):
        _ = manager.tools


async def test_concurrency_cap_is_respected_in_memory() -> None:
    async with ToolManager.in_memory({"calc": make_server("calc")}, max_concurrency=4) as manager:
        async with anyio.create_task_group() as tg:
            for _ in range(40):
                tg.start_soon(manager.call, "nap", {"seconds": 0.01})
        m = manager.metrics()
    assert m["tools/calc/inflight_max"] == 4
    assert m["tools/calc/calls"] == 40
    assert "tools/calc/errors" not in m


async def test_a_call_queued_behind_the_concurrency_cap_reports_its_wait_apart_from_its_run() -> None:
    results: dict[str, ToolResult] = {}

    async def run(label: str, seconds: float) -> None:
        results[label] = await manager.call("nap", {"seconds": seconds})

    manager = ToolManager.in_memory({"calc": make_server("calc")}, max_concurrency=1)
    async with manager, anyio.create_task_group() as tg:
        tg.start_soon(run, "first", 0.3)
        await anyio.wait_all_tasks_blocked()
        tg.start_soon(run, "queued", 0.0)
    first, queued = results["first"], results["queued"]
    assert first.ok
    assert queued.ok
    assert first.queue_s < 0.1
    assert first.latency_s - first.queue_s >= 0.3
    # The second call waited out the rest of the first call's nap before it was dispatched, then ran at once.
    assert 0.1 <= queued.queue_s <= queued.latency_s
    assert queued.latency_s - queued.queue_s < 0.1
