"""`ToolManager`: every configured MCP server behind one pooled, fault-tolerant call path."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import anyio
import anyio.abc
import attrs
import structlog

from mcprl_tools.call import call_server, failed_result
from mcprl_tools.cassette import CassettePlayer, CassetteRecorder, EpisodeHistories
from mcprl_tools.catalogue import build_catalogue, index_catalogue
from mcprl_tools.config import ServerConfig, ServersConfig
from mcprl_tools.errors import ManagerNotStartedError, ServerStartError
from mcprl_tools.metrics import CallMetrics, StepWindow
from mcprl_tools.results import ToolResult, ToolSpec
from mcprl_tools.server import ServerRunner
from mcprl_tools.validation import ArgumentChecker, transport_problem

logger = structlog.get_logger()

_DEFAULT_MAX_ARGUMENT_BYTES: int = attrs.fields(ServerConfig).max_argument_bytes.default


class ToolManager:
    """Starts every configured server concurrently and calls their tools.

    Use as an async context manager; `call` never raises for tool or infrastructure faults.

    Args:
        config: The servers to run.
        memory_servers: In-process server objects for `transport == "memory"` entries.
        record: Write every call that reaches a server, and its result, to this JSON-lines cassette.
        replay: Serve calls from this cassette instead of running servers (see `mcprl_tools.cassette`); a
            call it does not hold is an infrastructure error result (`replay_miss`). `config` still gives
            the servers' argument aliases and size limits; no server is started.
        miss_report: In replay mode, append one JSON line per missed call to this file.

    Raises:
        CassetteError: `replay` cannot be read or is malformed.
        ValueError: Both `record` and `replay` are given.
    """

    def __init__(
        self,
        config: ServersConfig,
        *,
        memory_servers: Mapping[str, object] | None = None,
        record: str | Path | None = None,
        replay: str | Path | None = None,
        miss_report: str | Path | None = None,
    ) -> None:
        if record is not None and replay is not None:
            raise ValueError(
                f"record ({record}) and replay ({replay}) are exclusive: replay starts no server"
            )
        self.config = config
        self._memory_servers = dict(memory_servers or {})
        self._record_path = record
        self._player = CassettePlayer(replay, miss_report=miss_report) if replay is not None else None
        self._histories = EpisodeHistories()
        self._runners: dict[str, ServerRunner] = {}
        self._tools: list[ToolSpec] = []
        self._index: dict[str, ToolSpec] = {}
        self._checkers: dict[str, ArgumentChecker] = {}
        self._metrics = CallMetrics()
        self._step = StepWindow()
        self._recorder: CassetteRecorder | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._started = False

    @classmethod
    def in_memory(
        cls,
        servers: Mapping[str, object],
        *,
        aliases: Mapping[str, str] | None = None,
        record: str | Path | None = None,
        **options: Any,
    ) -> ToolManager:
        """A manager over in-process `MCPServer` instances (tests, examples).

        Args:
            servers: Server objects by name.
            aliases: Global argument aliases.
            record: Optional cassette path.
            **options: `ServerConfig` fields applied to every server (e.g. `call_timeout`, `output_cap_bytes`).
        """
        cfgs = {name: ServerConfig(name=name, transport="memory", **options) for name in servers}
        config = ServersConfig(servers=cfgs, aliases=dict(aliases or {}), source="<in-memory>")
        return cls(config, memory_servers=servers, record=record)

    @classmethod
    def replay(cls, cassette: str | Path, *, miss_report: str | Path | None = None) -> ToolManager:
        """A manager that serves every call from `cassette`, with no server running and no aliases."""
        return cls(ServersConfig(servers={}, source=str(cassette)), replay=cassette, miss_report=miss_report)

    # -- lifecycle ------------------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._player is not None:
            self._set_catalogue(self._player.catalogue(self.config.servers))
            self._started = True
            return self
        self._runners = {
            name: ServerRunner(cfg, memory_server=self._memory_servers.get(name))
            for name, cfg in self.config.servers.items()
        }
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        try:
            for runner in self._runners.values():
                self._tg.start_soon(runner.run, name=f"mcp-server-{runner.cfg.name}")
            for runner in self._runners.values():
                await runner.first_attempt_done.wait()
            self._check_starts()
            self._set_catalogue(
                build_catalogue({n: r.tools for n, r in self._runners.items() if r.state != "unavailable"})
            )
            if self._record_path is not None:
                stateful = {name: cfg.stateful for name, cfg in self.config.servers.items()}
                self._recorder = CassetteRecorder(self._record_path, self._tools, stateful)
        except BaseException:
            await self._shutdown()
            raise
        self._started = True
        return self

    def _check_starts(self) -> None:
        failed = [r for r in self._runners.values() if r.start_error is not None]
        for r in failed:
            logger.error(
                "mcp_server_start_failed", server=r.cfg.name, optional=r.cfg.optional, error=r.start_error
            )
        fatal = [r for r in failed if not r.cfg.optional]
        if fatal:
            details = "\n".join(f"server {r.cfg.name!r}: {r.start_error}" for r in fatal)
            raise ServerStartError(
                f"{self.config.source}: {len(fatal)} server(s) failed to start:\n{details}"
            )

    def _set_catalogue(self, tools: Sequence[ToolSpec]) -> None:
        self._tools = list(tools)
        self._index = index_catalogue(self._tools)
        self._checkers = {
            s.qualified_name: ArgumentChecker(s.input_schema, self._aliases_for(s.server))
            for s in self._tools
        }

    def _aliases_for(self, server: str) -> dict[str, str]:
        if server in self.config.servers:
            return self.config.aliases_for(server)
        return dict(self.config.aliases)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._started = False
        if self._player is not None:
            self._player.log_summary()
        if self._recorder is not None:
            logger.info("cassette_recorded", cassette=str(self._recorder.path), calls=self._recorder.calls)
            self._recorder.close()
            self._recorder = None
        await self._shutdown()

    async def _shutdown(self) -> None:
        for runner in self._runners.values():
            runner.stop()
        if self._tg is not None:
            tg, self._tg = self._tg, None
            # The caller's exception is not the servers' business: it propagates from the caller's frame.
            await tg.__aexit__(None, None, None)

    # -- catalogue ------------------------------------------------------------------------------------------

    @property
    def tools(self) -> list[ToolSpec]:
        """Every exposed tool."""
        self._require_started()
        return list(self._tools)

    def tool_schemas(self, servers: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Function-tool schemas (`[{"type": "function", "function": {...}}]`), optionally for some servers."""
        self._require_started()
        return [t.function_schema() for t in self._tools if servers is None or t.server in servers]

    def server_state(self, server: str) -> str:
        """Lifecycle state of one server (`ready`, `restarting`, `unavailable`, ...)."""
        return self._runners[server].state

    async def wait_ready(self, server: str) -> bool:
        """Wait until `server` serves again (after a restart or a cool-down); False if it stopped instead.

        Bound it with the caller's own deadline (`anyio.fail_after`).
        """
        runner = self._runners[server]
        await runner.wait_state("ready", "stopped")
        return runner.state == "ready"

    def _require_started(self) -> None:
        if not self._started:
            raise ManagerNotStartedError("ToolManager used outside `async with ToolManager(...) as manager:`")

    # -- calls ----------------------------------------------------------------------------------------------

    async def call(
        self, name: str, arguments: Mapping[str, Any] | None = None, *, episode_id: str | None = None
    ) -> ToolResult:
        """Call a tool. Never raises for tool or infrastructure faults: inspect `ToolResult.kind`.

        Args:
            name: Exposed tool name or `server.tool`.
            arguments: The tool's arguments (a JSON object).
            episode_id: Sent in the request `_meta` as `mcprl/episode_id` for per-episode state.

        Raises:
            ManagerNotStartedError: Outside the `async with` block.
        """
        self._require_started()
        start = time.perf_counter()
        spec = self._index.get(name)
        if spec is None:
            result = failed_result(name, None, "unknown_tool", self._unknown_tool_text(name), start)
        else:
            result = await self._call_spec(name, spec, arguments, episode_id, start)
        self._metrics.record(
            server=result.server, tool=spec.qualified_name if spec else name, error_type=result.error_type,
            latency_s=result.latency_s,
        )  # fmt: skip
        self._step.record(server=result.server, error_type=result.error_type, infra=result.is_infra_error)
        return result

    def _unknown_tool_text(self, name: str) -> str:
        import difflib

        near = difflib.get_close_matches(name, list(self._index), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        return f"Unknown tool {name!r}.{hint} Available tools: {', '.join(t.name for t in self._tools)}"

    async def _call_spec(
        self,
        name: str,
        spec: ToolSpec,
        arguments: Mapping[str, Any] | None,
        episode_id: str | None,
        start: float,
    ) -> ToolResult:
        server = spec.server
        if arguments is None:
            arguments = {}
        if not isinstance(arguments, Mapping):
            text = f"Invalid arguments for {name}: expected a JSON object, got {type(arguments).__name__}"
            return failed_result(name, server, "invalid_arguments", text, start)
        cfg = self.config.servers.get(server)
        max_bytes = cfg.max_argument_bytes if cfg is not None else _DEFAULT_MAX_ARGUMENT_BYTES
        problem = transport_problem(arguments, max_bytes=max_bytes)
        if problem is not None:
            text = f"Invalid arguments for {name}: {problem}; nothing was sent to the tool"
            return failed_result(name, server, "invalid_arguments", text, start)
        checker = self._checkers[spec.qualified_name]
        args = checker.normalise(arguments)
        problem = checker.error(args)
        if problem is not None:
            return failed_result(
                name, server, "invalid_arguments", f"Invalid arguments for {name}: {problem}", start
            )
        if self._player is None and self._recorder is None:
            return await call_server(
                name, spec, self._runners[server], args, episode_id, start, step=self._step
            )
        stateful = self._player.stateful.get(server, True) if self._player else cfg is None or cfg.stateful
        earlier, history = self._histories.advance(episode_id, server, spec.tool, args)
        key_history = history if stateful else None
        if self._player is not None:
            return self._player.serve(name, spec, args, key_history, episode_id, earlier)
        result = await call_server(
            name, spec, self._runners[server], args, episode_id, start, step=self._step
        )
        if self._recorder is not None:
            self._recorder.record(spec, args, key_history, episode_id, result)
        return result

    # -- health and metrics ---------------------------------------------------------------------------------

    async def check_health(self) -> dict[str, bool]:
        """Ping every ready server now (and re-list its tools for catalogue pinning); True when it answered.

        A server that does not answer is restarted.
        """
        self._require_started()
        results: dict[str, bool] = {}

        async def one(runner: ServerRunner) -> None:
            ok = runner.state == "ready" and await runner.check()
            if not ok and runner.state == "ready":
                runner.report_suspect()
            results[runner.cfg.name] = ok

        async with anyio.create_task_group() as tg:
            for runner in self._runners.values():
                tg.start_soon(one, runner)
        return results

    def metrics(self) -> dict[str, float]:
        """Calls, errors by kind, latency p50/p95 per server and tool, restarts and in-flight gauges."""
        gauges: list[tuple[str, float]] = []
        for name, r in self._runners.items():
            gauges += [
                (f"tools/{name}/restarts", float(r.restarts)),
                (f"tools/{name}/crashes", float(r.crashes)),
                (f"tools/{name}/inflight", float(r.inflight)),
                (f"tools/{name}/inflight_max", float(r.inflight_max)),
                (f"tools/{name}/available", float(r.state not in ("unavailable", "stopped"))),
                (f"tools/{name}/catalogue_changed", float(r.catalogue_changed)),
            ]
        gauges.append(("tools/restarts", float(sum(r.restarts for r in self._runners.values()))))
        return self._metrics.snapshot(gauges)

    def step_metrics(self) -> dict[str, float]:
        """Infrastructure events since the previous call, for one line of a trainer's metrics per step.

        Restarts, crashes, unavailable periods, timeouts, infrastructure errors and queue waits, overall and
        per server, under `tools/step/` (see `mcprl_tools.metrics.StepWindow`).
        """
        totals = {
            name: {"restarts": r.restarts, "crashes": r.crashes, "unavailable_periods": r.unavailable_periods}
            for name, r in self._runners.items()
        }
        out = self._step.take(totals)
        if self._player is not None:
            out.update(self._player.take_counts())
        return out
