"""bench_tools: the pooled ToolManager vs spawn-per-call vs a bare SDK session, plus a concurrency table.

One trivial stdio MCP server (an async `add` tool). Measured in one run:

- median latency of one call through the manager (pooled, long-lived session),
- median latency of spawning a server per call (connect, initialize, call, close: the connect-per-call
  pattern other frameworks use),
- median latency on a bare SDK session (`mcp.Client` over stdio: the floor), interleaved with the manager
  in rounds so machine load hits both alike,
- throughput through the manager (and the bare session) at 1, 8, 32, 128 and 256 concurrent calls.

Targets: pooled ≥ 100× faster than spawn-per-call, manager overhead over the bare session ≤ 0.5 ms p50,
≥ 500 calls/s concurrent on one server. Prints `pooled_vs_spawn_speedup: <ratio>` last and replaces its own
``## bench_tools`` section in ``benchmarks/RESULTS.md``.

Run: `uv run python benchmarks/bench_tools.py` (about 1–2 minutes).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
from mcp import Client, StdioServerParameters
from results_md import replace_section

from mcprl_tools import ServersConfig, ToolManager

SERVER = """
from mcp.server.mcpserver import MCPServer

server = MCPServer("bench")


@server.tool(description="Add two integers.")
async def add(a: int, b: int) -> int:
    return a + b


if __name__ == "__main__":
    server.run()
"""
ROUNDS, CALLS_PER_ROUND = 6, 150
SPAWN_SAMPLES = 6
LEVELS = (1, 8, 32, 128, 256)
CALLS_AT_LEVEL = {1: 300, 8: 800, 32: 1000, 128: 1280, 256: 1536}


async def _timed(fn: Callable[[], Awaitable[Any]], n: int) -> list[float]:
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        out.append(time.perf_counter() - t0)
    return out


async def _alternating(
    first: Callable[[], Awaitable[Any]], second: Callable[[], Awaitable[Any]], n: int
) -> tuple[list[float], list[float]]:
    """Latencies of `first` and `second` called alternately, so machine load hits both alike."""
    a: list[float] = []
    b: list[float] = []
    for _ in range(n):
        a += await _timed(first, 1)
        b += await _timed(second, 1)
    return a, b


async def measure_in_process() -> tuple[list[float], list[float]]:
    """Manager vs bare `mcp.Client` on the same in-process server: the manager's own cost, no pipes."""
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("bench")

    @server.tool(description="Add two integers.")
    async def add(a: int, b: int) -> int:
        return a + b

    async with ToolManager.in_memory({"bench": server}) as manager, Client(server) as bare:

        async def via_manager() -> None:
            assert (await manager.call("add", {"a": 1, "b": 2})).ok

        async def via_bare() -> None:
            assert not (await bare.call_tool("add", {"a": 1, "b": 2})).is_error

        await _alternating(via_manager, via_bare, 200)
        return await _alternating(via_manager, via_bare, 3000)


async def _throughput(fn: Callable[[], Awaitable[Any]], concurrency: int, total: int) -> tuple[float, float]:
    """Calls per second, and client-process CPU milliseconds per call."""
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await fn()

    t0, c0 = time.perf_counter(), time.process_time()
    async with anyio.create_task_group() as tg:
        for _ in range(concurrency):
            tg.start_soon(worker)
    return total / (time.perf_counter() - t0), (time.process_time() - c0) / total * 1000


async def measure(script: Path) -> dict[str, Any]:
    params = StdioServerParameters(command=sys.executable, args=[str(script)])
    cfg = ServersConfig.from_dict(
        {"mcpServers": {"bench": {"command": sys.executable, "args": [str(script)], "max_concurrency": 256}}},
        source="bench_tools",
    )
    res: dict[str, Any] = {}
    async with ToolManager(cfg) as manager, Client(params) as bare:

        async def via_manager() -> None:
            r = await manager.call("add", {"a": 1, "b": 2})
            assert r.ok, r

        async def via_bare() -> None:
            r = await bare.call_tool("add", {"a": 1, "b": 2})
            assert not r.is_error

        await _timed(via_manager, 50)
        await _timed(via_bare, 50)
        res["pooled"], res["bare"] = await _alternating(via_manager, via_bare, ROUNDS * CALLS_PER_ROUND)
        res["levels"] = {}
        for level in LEVELS:
            total = CALLS_AT_LEVEL[level]
            res["levels"][level] = (
                await _throughput(via_manager, level, total),
                await _throughput(via_bare, level, total),
            )
        res["inflight_max"] = manager.metrics()["tools/bench/inflight_max"]

    async def spawn_once() -> None:
        async with Client(params) as client:
            r = await client.call_tool("add", {"a": 1, "b": 2})
            assert not r.is_error

    res["spawn"] = await _timed(spawn_once, SPAWN_SAMPLES)
    return res


def _ms(values: list[float], q: float = 0.5) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "bench_server.py"
        script.write_text(SERVER, encoding="utf-8")
        t0 = time.perf_counter()
        res = anyio.run(measure, script)
        res["inproc"] = anyio.run(measure_in_process)
        wall = time.perf_counter() - t0
    pooled, bare, spawn = _ms(res["pooled"]), _ms(res["bare"]), _ms(res["spawn"])
    overhead = pooled - bare
    paired = statistics.median(m - b for m, b in zip(res["pooled"], res["bare"], strict=True)) * 1000
    in_m, in_b = res["inproc"]
    in_paired = statistics.median(m - b for m, b in zip(in_m, in_b, strict=True)) * 1000
    speedup = spawn / pooled
    best = max(m[0] for m, _ in res["levels"].values())
    rows = "\n".join(
        f"| {level} | {m[0]:,.0f} | {b[0]:,.0f} | {m[1]:.2f} | {b[1]:.2f} |"
        for level, (m, b) in res["levels"].items()
    )
    load = os.getloadavg()[0]
    section = f"""## bench_tools

Trivial async `add` tool on one Python stdio MCP server (mcp {_version("mcp")}). Pooled = `ToolManager.call`
(lookup, alias, JSON-schema validation, deadline, per-server cap, metrics) on a long-lived session; bare = an
`mcp.Client` session on its own server process, called alternately with the manager
({ROUNDS * CALLS_PER_ROUND} calls each); spawn-per-call = start server + initialize + call + close ({SPAWN_SAMPLES} samples).

- command: `uv run python benchmarks/bench_tools.py`
- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; wall {wall:.0f} s; load average at the end {load:.1f}
- machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.machine()}

| path | p50 (ms) | p95 (ms) |
|---|---:|---:|
| pooled manager | {pooled:.2f} | {_ms(res["pooled"], 0.95):.2f} |
| bare SDK session (floor) | {bare:.2f} | {_ms(res["bare"], 0.95):.2f} |
| spawn per call | {spawn:.0f} | {_ms(res["spawn"], 0.95):.0f} |
| in-process server: manager | {_ms(in_m):.3f} | {_ms(in_m, 0.95):.3f} |
| in-process server: bare `mcp.Client` | {_ms(in_b):.3f} | {_ms(in_b, 0.95):.3f} |

manager overhead over the bare session (target ≤ 0.5 ms p50): stdio {overhead:+.3f} ms as a difference of
medians, {paired:+.3f} ms as the median of paired differences; in-process (no pipes, no second process, so
the least noisy) {in_paired:+.3f} ms paired.

| concurrent calls | manager calls/s | bare session calls/s | manager client CPU ms/call | bare client CPU ms/call |
|---:|---:|---:|---:|---:|
{rows}

best manager throughput on one server: {best:,.0f} calls/s (target ≥ 500); max in flight seen by the
manager: {res["inflight_max"]:.0f}. Client and server share the machine's {os.cpu_count()} cores (with whatever
else runs), so calls/s is bounded by the server's and the client's CPU per call; the CPU columns show what
the manager adds on the client side.

pooled_vs_spawn_speedup: {speedup:.1f} (target ≥ 100)
"""
    replace_section(section)
    print(section.split("\n", 2)[2])
    print(
        f"manager_overhead_p50_ms: stdio {overhead:.3f}, stdio paired {paired:.3f}, in-process paired {in_paired:.3f}"
    )
    print(f"best_throughput_calls_per_s: {best:.0f}")
    print(f"pooled_vs_spawn_speedup: {speedup:.1f}")


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)


if __name__ == "__main__":
    main()
