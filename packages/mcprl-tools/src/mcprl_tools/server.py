"""One supervised server: a task that owns its session, restarts it with backoff, and pins its catalogue.

The session is entered and exited inside `ServerRunner.run` (the SDK requires one task for both); callers
use the published `Connection` concurrently from their own tasks.
"""

from __future__ import annotations

import math
import time
from collections import deque
from typing import Literal

import anyio
import structlog

from mcprl_tools._mcp import Connection, RawTool, StderrTail, connect
from mcprl_tools.catalogue import catalogue_hash
from mcprl_tools.config import ServerConfig

logger = structlog.get_logger()

State = Literal["starting", "ready", "checking", "restarting", "unavailable", "stopped"]
Outcome = Literal["stopped", "crashed", "hung", "start_failed"]

_STDERR_TAIL_BYTES = 2048
_GRACE_S = 2.0  # after stdin close, and after SIGTERM, for a server that is still answering
_HUNG_GRACE_S = 0.25  # the same for a server that failed its health probe


def _flatten(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for sub in exc.exceptions for leaf in _flatten(sub)]
    return [exc]


def _describe(exc: BaseException) -> str:
    return "; ".join(f"{type(e).__name__}: {e}" for e in _flatten(exc))


class ServerRunner:
    """Supervises one server for the lifetime of a manager.

    Attributes:
        cfg: The server's configuration.
        limiter: Caps this server's calls in flight.
        state: Lifecycle state.
        tools: Tools exposed after allow/deny filtering (from the first successful start).
        pinned_hash: Catalogue hash pinned at the first start.
        catalogue_changed: Whether a later listing differed from the pinned one.
        start_error: Why the first start failed (stderr tail included), if it did.
        restarts: Restarts so far.
        crashes: Crashes and hangs so far (each ended a session).
        generation: Sessions published so far: 1 after the first start, +1 per restart (0 before).
        unavailable_periods: Times the crash budget ran out and the server rested for `restart.cooldown`.
        inflight: Calls in flight now; `inflight_max` is the high-water mark.
    """

    def __init__(self, cfg: ServerConfig, *, memory_server: object | None = None) -> None:
        self.cfg = cfg
        self._memory_server = memory_server
        self.limiter = anyio.CapacityLimiter(cfg.max_concurrency)
        self.state: State = "starting"
        self.conn: Connection | None = None
        self.tools: list[RawTool] = []
        self.pinned_hash: str | None = None
        self.catalogue_changed = False
        self.start_error: str | None = None
        self.last_error: str | None = None
        self.restarts = 0
        self.crashes = 0
        self.generation = 0
        self.unavailable_periods = 0
        self.inflight = 0
        self.inflight_max = 0
        self.first_attempt_done = anyio.Event()
        self._ready = anyio.Event()
        self._changed = anyio.Event()
        self._wake = anyio.Event()
        self._stopping = False
        self._lost = False
        self._suspect = False
        self._hung = False
        self._start_scope: anyio.CancelScope | None = None
        self._stop_event = anyio.Event()

    # -- signals from callers -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the supervisor to close the session and exit."""
        self._stopping = True
        self._stop_event.set()
        if self._start_scope is not None and self.state in ("starting", "restarting"):
            self._start_scope.cancel()
        self._wake.set()

    def report_suspect(self) -> None:
        """A call timed out or failed oddly: probe the server and restart it if it stays unresponsive.

        New calls wait for the verdict instead of piling onto a possibly hung session.
        """
        self._suspect = True
        if self.state == "ready":
            self._set_state("checking")
        self._wake.set()

    def _report_lost(self) -> None:
        self._lost = True
        if self.state in ("ready", "checking"):
            # Synchronously, so no call lands on the dead session before the supervisor wakes up.
            self.conn = None
            self._set_state("restarting")
        self._wake.set()

    async def wait_ready(self) -> Connection | None:
        """The live connection, waiting through a (re)start; None when the server is unavailable/stopped."""
        while True:
            match self.state:
                case "ready":
                    return self.conn
                case "unavailable" | "stopped":
                    return None
                case "starting" | "checking" | "restarting":
                    await self._ready.wait()

    async def wait_state(self, *states: State) -> None:
        """Return once the server is in one of `states` (through restarts and cool-downs)."""
        while self.state not in states:
            await self._changed.wait()

    def _set_state(self, state: State) -> None:
        self.state = state
        self._changed.set()
        self._changed = anyio.Event()
        if state in ("ready", "unavailable", "stopped"):
            self._ready.set()
        elif self._ready.is_set():
            self._ready = anyio.Event()

    # -- supervision ----------------------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve, restart with backoff on crash or hang; past the crash budget rest, then start afresh."""
        policy = self.cfg.restart
        crash_times: deque[float] = deque()
        failures = 0
        while True:
            first = not self.first_attempt_done.is_set()
            outcome = await self._serve_once()
            self.first_attempt_done.set()
            if outcome == "stopped" or self._stopping:
                self._set_state("stopped")
                return
            if first and outcome == "start_failed":
                self._set_state("unavailable")
                return
            self.crashes += 1
            now = time.monotonic()
            crash_times.append(now)
            while crash_times and crash_times[0] < now - policy.window:
                crash_times.popleft()
            failures = failures + 1 if outcome == "start_failed" else 1
            if len(crash_times) > policy.max_crashes:
                if not await self._cool_down(len(crash_times)):
                    return
                crash_times.clear()
                failures = 0
                self.restarts += 1
                continue
            delay = policy.delay(failures)
            logger.warning(
                "mcp_server_restarting",
                server=self.cfg.name,
                outcome=outcome,
                delay_s=delay,
                error=self.last_error,
            )
            self._set_state("restarting")
            with anyio.move_on_after(delay):
                await self._stop_event.wait()
            if self._stopping:
                self._set_state("stopped")
                return
            self.restarts += 1

    async def _cool_down(self, crashes: int) -> bool:
        """Unavailable for `restart.cooldown` seconds (calls fail fast); False when stopped meanwhile."""
        cooldown = self.cfg.restart.cooldown
        self.unavailable_periods += 1
        logger.error("mcp_server_unavailable", server=self.cfg.name, crashes=crashes, cooldown_s=cooldown)
        self._set_state("unavailable")
        with anyio.move_on_after(cooldown):
            await self._stop_event.wait()
        if self._stopping:
            self._set_state("stopped")
            return False
        logger.warning("mcp_server_retrying_after_cooldown", server=self.cfg.name)
        self._set_state("restarting")
        return True

    def _shutdown_grace(self) -> float:
        return _HUNG_GRACE_S if self._hung else _GRACE_S

    async def _serve_once(self) -> Outcome:
        self._lost = False
        self._suspect = False
        self._hung = False
        errlog = StderrTail(_STDERR_TAIL_BYTES)
        started = False
        try:
            with anyio.CancelScope(deadline=anyio.current_time() + self.cfg.start_timeout) as scope:
                self._start_scope = scope
                if self._stopping:
                    scope.cancel()
                try:
                    async with connect(
                        self.cfg,
                        on_lost=self._report_lost,
                        memory_server=self._memory_server,
                        stderr=errlog,
                        shutdown_grace=self._shutdown_grace,
                    ) as conn:
                        listed = await conn.list_tools()
                        scope.deadline = math.inf
                        started = True
                        self._publish(conn, listed)
                        outcome = await self._supervise(conn)
                    if outcome != "stopped":
                        # The transport has exited, so the tail now holds all the server wrote.
                        reason = self.last_error if outcome == "hung" else "connection lost"
                        self.last_error = self.cfg.redact(f"{reason}{self._stderr_note(errlog)}")
                    return outcome
                except Exception as exc:
                    # Start or transport failures surface here, often wrapped in exception groups.
                    detail = self.cfg.redact(f"{_describe(exc)}{self._stderr_note(errlog)}")
                    self.last_error = detail
                    if not started:
                        self.start_error = detail
                        return "start_failed"
                    return "crashed"
            if self._stopping:
                return "stopped"
            self.start_error = self.last_error = self.cfg.redact(
                f"did not start within {self.cfg.start_timeout:g} s{self._stderr_note(errlog)}"
            )
            return "start_failed"
        finally:
            self._start_scope = None
            self.conn = None

    def _stderr_note(self, errlog: StderrTail) -> str:
        tail = errlog.text()
        return f"\n--- stderr tail of {self.cfg.name} ---\n{tail}" if tail else ""

    def _publish(self, conn: Connection, listed: list[RawTool]) -> None:
        tools = [t for t in listed if self.cfg.exposes(t.name)]
        digest = catalogue_hash(tools)
        if self.pinned_hash is None:
            self.pinned_hash = digest
            self.tools = tools
        elif digest != self.pinned_hash:
            self._catalogue_mismatch(digest)
        self.generation += 1
        self.conn = conn
        self._set_state("ready")
        self.first_attempt_done.set()
        logger.info(
            "mcp_server_ready",
            server=self.cfg.name,
            tools=len(tools),
            restarts=self.restarts,
            generation=self.generation,
        )

    def _catalogue_mismatch(self, digest: str) -> None:
        if not self.catalogue_changed:
            logger.warning(
                "mcp_catalogue_changed",
                server=self.cfg.name,
                pinned=self.pinned_hash,
                now=digest,
                policy=self.cfg.on_catalogue_change,
            )
        self.catalogue_changed = True

    async def _supervise(self, conn: Connection) -> Outcome:
        interval = self.cfg.health_interval or math.inf
        while True:
            self._wake = anyio.Event()
            if self._stopping:
                outcome: Outcome = "stopped"
                break
            if self._lost:
                outcome = "crashed"
                break
            if self._suspect:
                self._suspect = False
                if not await self.check(conn):
                    outcome = "hung"
                    self._hung = True
                    break
                if self.state == "checking":
                    self._set_state("ready")
                continue
            with anyio.move_on_after(interval) as timer:
                await self._wake.wait()
            if timer.cancelled_caught:
                self._suspect = True
        # Unpublish before the (possibly slow) transport shutdown so no new call lands on this session.
        self.conn = None
        if outcome != "stopped":
            self._set_state("restarting")
        return outcome

    async def check(self, conn: Connection | None = None) -> bool:
        """Probe the server by re-listing its tools (also checks the pinned catalogue).

        A `tools/list` round trip is the probe rather than `ping`, which 2026-era servers no longer serve.

        Returns:
            False if it does not answer within `ping_timeout`.
        """
        conn = conn or self.conn
        if conn is None:
            return False
        with anyio.move_on_after(self.cfg.ping_timeout):
            try:
                listed = await conn.list_tools()
            except Exception as exc:
                self.last_error = self.cfg.redact(_describe(exc))
                return False
            digest = catalogue_hash([t for t in listed if self.cfg.exposes(t.name)])
            if digest != self.pinned_hash:
                self._catalogue_mismatch(digest)
            return True
        self.last_error = f"no answer to a health probe within {self.cfg.ping_timeout:g} s"
        return False
