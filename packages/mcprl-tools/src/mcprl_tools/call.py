"""One tool call on a running server: wait for its session, queue on its limiter, time out, map every fault
to a `ToolResult`.

`call_server` is the last step of `ToolManager.call`, after the arguments were checked; it never raises for a
tool or infrastructure fault. `failed_result` builds the result of a call that failed anywhere on that path.
"""

from __future__ import annotations

import time
from typing import Any

import anyio

from mcprl_tools._mcp import (
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    Connection,
    ConnectionLostError,
    RemoteError,
    UnsendableRequestError,
)
from mcprl_tools.metrics import StepWindow
from mcprl_tools.output import truncate_text
from mcprl_tools.results import ErrorType, ToolResult, ToolSpec
from mcprl_tools.server import ServerRunner

__all__ = ["call_server", "failed_result"]


def failed_result(
    name: str,
    server: str | None,
    error_type: ErrorType,
    text: str,
    start: float,
    generation: int | None = None,
    stateful: bool = False,
    *,
    queue_s: float = 0.0,
) -> ToolResult:
    """A failed call's result; `generation` when the request reached that session of the server.

    Args:
        name: The tool name the call used.
        server: The server it was routed to (None: no server owns the name).
        error_type: What failed; the model's faults are `tool_error` results, the rest `infra_error`.
        text: What the model sees.
        start: `time.perf_counter()` when the call began.
        generation: The server session the request reached.
        stateful: Whether that server keeps per-episode state.
        queue_s: How long the call waited before it was dispatched (0: it never was).
    """
    kind = (
        "tool_error" if error_type in ("unknown_tool", "invalid_arguments", "tool_error") else "infra_error"
    )
    return ToolResult(
        kind=kind,
        text=text,
        name=name,
        server=server,
        error_type=error_type,
        latency_s=time.perf_counter() - start,
        generation=generation,
        stateful=stateful,
        queue_s=queue_s,
    )


async def call_server(
    name: str,
    spec: ToolSpec,
    runner: ServerRunner,
    args: dict[str, Any],
    episode_id: str | None,
    start: float,
    *,
    step: StepWindow,
) -> ToolResult:
    """Call `spec` on `runner`'s server with checked `args`; never raises for tool or infrastructure faults.

    Args:
        name: The tool name the call used (exposed or `server.tool`).
        spec: The tool.
        runner: Its server.
        args: Normalised, validated arguments.
        episode_id: Sent in the request `_meta`.
        start: `time.perf_counter()` when the call began.
        step: Receives the time the call queued for the server's limiter.
    """
    cfg = runner.cfg
    timeout = cfg.call_timeout
    conn = await _session(runner)
    if conn is None:
        return _unavailable(name, runner, start)
    if runner.catalogue_changed and cfg.on_catalogue_change == "refuse":
        text = f"Tool {name} refused: the tool catalogue of server {cfg.name!r} changed since start"
        return failed_result(name, cfg.name, "catalogue_changed", text, start)
    queued = time.perf_counter()
    async with runner.limiter:
        step.queue_wait(cfg.name, time.perf_counter() - queued)
        if runner.conn is not conn:
            # The session this call queued for ended while it waited; its successor serves it instead.
            conn = await _session(runner)
            if conn is None:
                return _unavailable(name, runner, start)
        generation = runner.generation
        waited = time.perf_counter() - start
        runner.inflight += 1
        runner.inflight_max = max(runner.inflight_max, runner.inflight)
        raw = None
        try:
            with anyio.move_on_after(timeout) as deadline:
                raw = await conn.call_tool(spec.tool, args, episode_id)
        except ConnectionLostError as exc:
            text = f"Tool {name} failed: server {cfg.name!r} crashed or closed the connection ({exc})"
            return failed_result(
                name, cfg.name, "crashed", text, start, generation, cfg.stateful, queue_s=waited
            )
        except UnsendableRequestError as exc:
            # Only the model's arguments vary between requests, so what cannot be encoded is theirs.
            text = f"Invalid arguments for {name}: they cannot be encoded as JSON ({exc}); nothing was sent"
            return failed_result(name, cfg.name, "invalid_arguments", text, start, queue_s=waited)
        except RemoteError as exc:
            if exc.code in (INVALID_PARAMS, METHOD_NOT_FOUND):
                text = f"Tool {name} error: {exc.message}"
                return failed_result(name, cfg.name, "tool_error", text, start, queue_s=waited)
            runner.report_suspect()
            text = f"Tool {name} failed: {exc}"
            return failed_result(
                name, cfg.name, "transport", text, start, generation, cfg.stateful, queue_s=waited
            )
        except Exception as exc:
            # The call boundary: a transport fault of any type becomes an infra result, never a raise.
            runner.report_suspect()
            text = f"Tool {name} failed: transport error {type(exc).__name__}: {cfg.redact(str(exc))}"
            return failed_result(
                name, cfg.name, "transport", text, start, generation, cfg.stateful, queue_s=waited
            )
        finally:
            runner.inflight -= 1
    if raw is None or deadline.cancelled_caught:
        runner.report_suspect()
        text = f"Tool {name} timed out after {timeout:g} s"
        return failed_result(name, cfg.name, "timeout", text, start, generation, cfg.stateful, queue_s=waited)
    text, structured = raw.text, raw.structured
    if cfg.secrets:
        # A server must not hand its own credentials to the model, even by echoing them.
        text, structured = cfg.redact(text), cfg.redact_json(structured)
    text, truncated = truncate_text(text, cfg.output_cap_bytes)
    return ToolResult(
        kind="tool_error" if raw.is_error else "ok",
        text=text,
        structured=structured,
        name=name,
        server=cfg.name,
        error_type="tool_error" if raw.is_error else None,
        latency_s=time.perf_counter() - start,
        truncated=truncated,
        generation=generation,
        stateful=cfg.stateful,
        queue_s=waited,
    )


async def _session(runner: ServerRunner) -> Connection | None:
    """The server's live session; a (re)starting server gets its start timeout to come up."""
    if runner.state == "ready" and runner.conn is not None:
        return runner.conn
    with anyio.move_on_after(runner.cfg.start_timeout + runner.cfg.ping_timeout):
        return await runner.wait_ready()
    return None


def _unavailable(name: str, runner: ServerRunner, start: float) -> ToolResult:
    detail = runner.last_error or runner.start_error or runner.state
    text = f"Tool {name} unavailable: server {runner.cfg.name!r} is {runner.state} ({detail})"
    return failed_result(name, runner.cfg.name, "unavailable", text, start)
