"""bench_env: what the environment itself costs per turn, episode throughput, and streaming task loading.

- Per-turn overhead: 64 three-turn episodes run one after another over an in-process calculator MCP server with
  the scripted sampler and the character test tokenizer. Time inside the sampler and
  inside `manager.call` is measured and subtracted: what is left is the environment (render + drift check +
  encode + parse + bookkeeping + rewards). Target: ≤ 5 ms per turn, small next to generating a turn.
- Throughput: 32 tasks × G=8 episodes through `run_groups(max_concurrent_episodes=64)`.
- Loading: a 100k-task JSON array streamed with `iter_tasks` (tasks/s) and its peak traced memory.

Prints `env_overhead_per_turn_vs_target: <ratio>` last (≤ 1 meets the target) and replaces its own
``## bench_env`` section in ``benchmarks/RESULTS.md``.

Run: `uv run python benchmarks/bench_env.py` (under a minute).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from results_md import replace_section

from mcprl_env import Environment, iter_tasks, task_from_dict
from mcprl_env.testing import CharTokenizer, ScriptedCompletion, ScriptedSampler
from mcprl_tools import ToolManager

TARGET_MS = 5.0
SCRIPT = [
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 3, "b": 4.5}}\n</tool_call>',
    '<tool_call>\n{"name": "multiply", "arguments": {"a": 13.5, "b": 1}}\n</tool_call>',
    "<answer>13.5</answer>",
]


def make_server() -> MCPServer:
    server = MCPServer("calc")

    @server.tool(description="Multiply two numbers.")
    def multiply(a: float, b: float) -> str:
        return f"{a * b:g}"

    return server


class TimedSampler:
    def __init__(self, inner: ScriptedSampler) -> None:
        self.inner, self.spent = inner, 0.0

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> ScriptedCompletion:
        t = time.perf_counter()
        out = await self.inner.sample(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)
        self.spent += time.perf_counter() - t
        return out


class TimedManager:
    def __init__(self, inner: ToolManager) -> None:
        self.inner, self.spent = inner, 0.0

    @property
    def tools(self) -> Any:
        return self.inner.tools

    def tool_schemas(self, servers: Sequence[str] | None = None) -> list[dict[str, Any]]:
        return self.inner.tool_schemas(servers)

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, episode_id: str | None = None
    ) -> Any:
        t = time.perf_counter()
        out = await self.inner.call(name, arguments, episode_id=episode_id)
        self.spent += time.perf_counter() - t
        return out


def task(i: int) -> Any:
    return task_from_dict(
        {
            "id": f"mul-{i}",
            "prompt": "What is 3 times 4.5?",
            "servers": ["calc"],
            "answer": "13.5",
            "checker": {"type": "numeric", "abs_tol": 0.005},
        }
    )


async def measure() -> dict[str, float]:
    tok = CharTokenizer()
    async with ToolManager.in_memory({"calc": make_server()}) as raw:
        manager = TimedManager(raw)
        sampler = TimedSampler(ScriptedSampler(tok, SCRIPT))
        env = Environment(manager=manager, tokenizer=tok)
        await env.run_episode(task(0), sampler)  # warm-up
        manager.spent = sampler.spent = 0.0
        per_turn: list[float] = []
        turns = 0
        t0 = time.perf_counter()
        for i in range(64):
            before = (time.perf_counter(), manager.spent, sampler.spent)
            ep = await env.run_episode(task(i), sampler)
            assert ep.success, ep
            wall = time.perf_counter() - before[0]
            inner = (manager.spent - before[1]) + (sampler.spent - before[2])
            per_turn.append((wall - inner) / ep.metrics["turns"] * 1000)
            turns += int(ep.metrics["turns"])
        serial_wall = time.perf_counter() - t0
        t1 = time.perf_counter()
        groups = await env.run_groups(
            [task(i) for i in range(32)], sampler, group_size=8, max_concurrent_episodes=64
        )
        conc_wall = time.perf_counter() - t1
        assert all(ep.success for g in groups for ep in g.episodes)
        prompt_len = groups[0].episodes[0].prompt_length
    return {
        "overhead_ms_p50": statistics.median(per_turn),
        "overhead_ms_mean": statistics.fmean(per_turn),
        "serial_episodes_per_s": 64 / serial_wall,
        "turns": turns,
        "concurrent_episodes_per_s": 256 / conc_wall,
        "prompt_tokens": prompt_len,
    }


def loader() -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tasks.json"
        with path.open("w", encoding="utf-8") as fh:
            fh.write("[\n")
            for i in range(100_000):
                raw = {
                    "id": f"t{i:06d}",
                    "prompt": f"What is {i} times 2?",
                    "answer": str(2 * i),
                    "servers": ["calculator"],
                    "checker": {"type": "numeric"},
                    "metadata": {"pad": "x" * 100},
                }
                fh.write(json.dumps(raw) + (",\n" if i < 99_999 else "\n"))
            fh.write("]\n")
        size = path.stat().st_size
        t = time.perf_counter()
        n = sum(1 for _ in iter_tasks(path))
        rate = n / (time.perf_counter() - t)
        tracemalloc.start()
        sum(1 for _ in iter_tasks(path))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return {"tasks_per_s": rate, "file_mb": size / 1e6, "peak_mb": peak / 1e6}


def main() -> None:
    env = anyio.run(measure)
    load = loader()
    ratio = env["overhead_ms_p50"] / TARGET_MS
    section = f"""## bench_env

Environment cost per assistant turn (sampler and tool time subtracted) over 64 three-turn episodes on an
in-process calculator server with the scripted sampler and the character tokenizer (prompt {env["prompt_tokens"]:.0f}
tokens); episode throughput through `run_groups` (32 tasks × G=8, 64 in flight); a 100k-task JSON array
streamed with `iter_tasks`.

- command: `uv run python benchmarks/bench_env.py`
- date: {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC; load average {os.getloadavg()[0]:.1f}
- machine: {platform.machine()}, {os.cpu_count()} cores, Python {sys.version.split()[0]}, {platform.system()}

| measure | value |
|---|---:|
| env overhead per turn, p50 (ms) | {env["overhead_ms_p50"]:.2f} |
| env overhead per turn, mean (ms) | {env["overhead_ms_mean"]:.2f} |
| serial episodes / s | {env["serial_episodes_per_s"]:.1f} |
| concurrent episodes / s (64 in flight) | {env["concurrent_episodes_per_s"]:.1f} |
| task loading, tasks / s (100k JSON array) | {load["tasks_per_s"]:,.0f} |
| task file size (MB) / peak traced memory while streaming (MB) | {load["file_mb"]:.1f} / {load["peak_mb"]:.2f} |

env_overhead_per_turn_vs_target: {ratio:.2f} (target ≤ 1, i.e. ≤ {TARGET_MS:g} ms)
"""
    replace_section(section)
    print(section)
    print(f"env_overhead_per_turn_vs_target: {ratio:.2f}")


if __name__ == "__main__":
    main()
