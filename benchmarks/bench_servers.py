"""bench_servers: latency and throughput of the bundled offline MCP servers over real stdio sessions.

For calculator, finance, search and messaging: time to spawn + initialize, median and p95 latency of a
representative call on a live session (serial), and throughput with 32 calls in flight on one session
(messaging: 32 distinct episodes). Target: every server answers a representative call in ≤ 10 ms p50 on a
live session, so tool time is negligible next to generation. Prints `slowest_p50_vs_target: <ratio>` last
(≤ 1 meets the target) and replaces its own ``## bench_servers`` section in ``benchmarks/RESULTS.md``.

Run: `uv run python benchmarks/bench_servers.py` (under a minute).
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import statistics
import sys
import time
from typing import Any, cast

import anyio
from mcp import Client, StdioServerParameters
from mcp.types import RequestParamsMeta
from results_md import replace_section

SERIAL, CONCURRENT, IN_FLIGHT, TARGET_MS = 200, 640, 32, 10.0
CALLS: dict[str, tuple[str, dict[str, Any]]] = {
    "calculator": ("calculate", {"expression": "round(49.53 / 13.05 * 3, 2)"}),
    "finance": ("get_quote", {"symbol": "HLDR"}),
    "search": ("search", {"query": "Heldra Freight acquisition", "k": 5}),
    "messaging": ("read_messages", {"channel": "markets", "limit": 20}),
}


def _meta(i: int) -> RequestParamsMeta:
    return cast(RequestParamsMeta, {"mcprl/episode_id": f"bench-{i % IN_FLIGHT}"})


async def _measure(server: str) -> dict[str, float]:
    tool, args = CALLS[server]
    params = StdioServerParameters(command=sys.executable, args=["-m", f"mcprl_servers.{server}"])
    t0 = time.perf_counter()
    async with Client(params) as client:
        await client.list_tools()
        start_s = time.perf_counter() - t0
        lat: list[float] = []
        for i in range(SERIAL):
            t = time.perf_counter()
            result = await client.call_tool(tool, args, meta=_meta(i))
            lat.append((time.perf_counter() - t) * 1000)
            assert not result.is_error
        limiter = anyio.CapacityLimiter(IN_FLIGHT)

        async def one(i: int) -> None:
            async with limiter:
                assert not (await client.call_tool(tool, args, meta=_meta(i))).is_error

        t = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for i in range(CONCURRENT):
                tg.start_soon(one, i)
        rate = CONCURRENT / (time.perf_counter() - t)
    lat.sort()
    return {"start_s": start_s, "p50": statistics.median(lat), "p95": lat[int(0.95 * len(lat))], "rate": rate}


def main() -> None:
    rows = {name: anyio.run(_measure, name) for name in CALLS}
    slowest = max(r["p50"] for r in rows.values())
    table = "\n".join(
        f"| {name} | `{CALLS[name][0]}` | {r['start_s']:.2f} | {r['p50']:.2f} | {r['p95']:.2f} | {r['rate']:,.0f} |"
        for name, r in rows.items()
    )
    now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    section = f"""## bench_servers

Bundled offline servers over real stdio sessions (one server process each, mcp client in this process):
spawn + initialize + list_tools, then {SERIAL} serial calls, then {CONCURRENT} calls with {IN_FLIGHT} in flight
(messaging calls spread over {IN_FLIGHT} episode ids).

- command: `uv run python benchmarks/bench_servers.py`
- date: {now}; load average at the end {os.getloadavg()[0]:.1f}
- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()}

| server | call | start (s) | p50 (ms) | p95 (ms) | calls/s at {IN_FLIGHT} in flight |
|---|---|---:|---:|---:|---:|
{table}

slowest_p50_vs_target: {slowest / TARGET_MS:.2f} (target ≤ 1, i.e. p50 ≤ {TARGET_MS:.0f} ms)
"""
    replace_section(section)
    print(section)
    print(f"slowest_p50_vs_target: {slowest / TARGET_MS:.2f}")


if __name__ == "__main__":
    main()
