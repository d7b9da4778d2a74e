"""Python sandbox MCP server: ``run_python(code)`` runs model-written code in an isolated process tree.

The code is hostile input. The server process never runs it: every call starts a supervisor in fresh
namespaces (see :mod:`mcprl_servers.sandbox`) under a wall-clock deadline, rlimits, a memory cgroup, an empty
environment, a scratch tmpfs, a read-only filesystem, no network and a throw-away uid. Limits come from
the server's environment (``MCPRL_SANDBOX_*``) or command line, never from the model.

Run it with ``python -m mcprl_servers.python_sandbox`` (stdio) or use :func:`build_server` in-process.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence

import anyio
import structlog
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.errors import SandboxUnavailableError
from mcprl_servers.sandbox.config import SandboxConfig
from mcprl_servers.sandbox.runner import RunOutcome, rootless, run_sandboxed

__all__ = ["build_server", "check_sandbox", "format_outcome", "main"]

_PROBE = "print('sandbox ok')"

_SIGNAL_REASONS = {
    signal.SIGXCPU: "CPU time limit exceeded",
    signal.SIGXFSZ: "file size limit exceeded",
    signal.SIGKILL: "killed (SIGKILL: CPU hard limit or out of memory)",
}


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def _head(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}\n[... truncated: {len(text) - limit} more characters]"


def _tail(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"[... {len(text) - limit} earlier characters truncated]\n{text[-limit:]}"


def _streams(outcome: RunOutcome, config: SandboxConfig) -> str:
    parts: list[str] = []
    if outcome.stdout:
        parts.append(f"[stdout]\n{_tail(_text(outcome.stdout), config.error_tail_chars)}")
    if outcome.stderr:
        parts.append(f"[stderr]\n{_tail(_text(outcome.stderr), config.error_tail_chars)}")
    return "\n".join(parts)


def _exit_reason(exit_code: int) -> str:
    if exit_code >= 0:
        return f"exit status {exit_code}"
    try:
        sig = signal.Signals(-exit_code)
    except ValueError:
        return f"killed by signal {-exit_code}"
    return _SIGNAL_REASONS.get(sig, f"killed by signal {sig.name}")


def format_outcome(outcome: RunOutcome, config: SandboxConfig) -> str:
    """Turn a run into the tool's text result, or raise :class:`ToolError` for every failure.

    Raises:
        ToolError: The code raised, exited non-zero, was killed, timed out, exceeded the output cap,
            or isolation could not be set up (then the code was not run).
    """
    match outcome.status:
        case "setup_failed":
            raise ToolError(
                f"sandbox unavailable: {outcome.setup_error}. The code was not run "
                f"(required isolation: {config.isolation!r})."
            )
        case "timed_out":
            body = _streams(outcome, config)
            raise ToolError(
                f"timed out: killed at the {config.deadline_s:g} s wall-clock deadline; every process "
                f"of the call was killed.\n{config.describe_limits()}" + (f"\n{body}" if body else "")
            )
        case "output_capped":
            head = _head(_text(outcome.stdout or outcome.stderr), config.error_tail_chars)
            raise ToolError(
                f"output limit exceeded: the code wrote more than {config.output_cap_bytes} bytes and was "
                f"killed.\n{head}\n[... output truncated at {config.output_cap_bytes} bytes]"
            )
        case "exited":
            code = outcome.exit_code if outcome.exit_code is not None else -1
            if code != 0 and outcome.oom_killed:
                body = _streams(outcome, config)
                raise ToolError(
                    f"out of memory: the call held more than {config.memory_bytes // (1 << 20)} MiB in all "
                    "(its processes, shared memory and files together) and was killed.\n"
                    f"{config.describe_limits()}" + (f"\n{body}" if body else "")
                )
            if code != 0:
                body = _streams(outcome, config)
                raise ToolError(
                    f"{_exit_reason(code)}\n{config.describe_limits()}" + (f"\n{body}" if body else "")
                )
            text = _text(outcome.stdout)
            if outcome.stderr:
                text += f"\n[stderr]\n{_text(outcome.stderr)}"
            return _head(text, config.result_chars) if text else "(no output)"


def build_server(config: SandboxConfig | None = None) -> MCPServer:
    """Build the python sandbox server.

    Args:
        config: Limits and isolation; default: :meth:`SandboxConfig.from_env`.
    """
    cfg = SandboxConfig.from_env() if config is None else config
    server = MCPServer(
        name="python",
        instructions="Runs Python code in an isolated sandbox; print() what you need to see.",
    )
    limiter: list[anyio.CapacityLimiter] = []

    @server.tool(
        description=(
            "Run a Python 3 program and return what it prints (stdout; stderr is shown on errors). "
            "Each call is a fresh process: no state is kept between calls. Standard library only, no "
            "network, no input; the working directory is an empty scratch dir deleted afterwards. "
            f"{cfg.describe_limits()}."
        )
    )
    async def run_python(code: str) -> str:
        """Run Python code in the sandbox.

        Args:
            code: A complete Python program; use print() to show results.
        """
        if len(code.encode("utf-8", errors="surrogateescape")) > cfg.max_code_bytes:
            raise ToolError(f"code too large: more than {cfg.max_code_bytes} bytes")
        if not limiter:
            limiter.append(anyio.CapacityLimiter(cfg.max_concurrency))
        async with limiter[0]:
            try:
                outcome = await run_sandboxed(code, cfg)
            except OSError as exc:
                raise ToolError(f"sandbox unavailable: {exc}. The code was not run.") from exc
        return format_outcome(outcome, cfg)

    return server


async def check_sandbox(config: SandboxConfig) -> str:
    """Run a probe through the sandbox as a call would; what it printed.

    Raises:
        SandboxUnavailableError: Isolation cannot be set up here (or the probe did not print); the message
            says why and what to change.
    """
    try:
        outcome = await run_sandboxed(_PROBE, config)
    except OSError as exc:
        reason = str(exc)
    else:
        if outcome.status == "exited" and outcome.exit_code == 0 and outcome.stdout.strip() == b"sandbox ok":
            return _text(outcome.stdout)
        reason = outcome.setup_error or (
            f"the probe ended {outcome.status} (exit {outcome.exit_code}): {_tail(_text(outcome.stderr), 500)}"
        )
    if config.isolation == "namespaces" and rootless():
        fix = (
            "without root, namespaces isolation needs unprivileged user namespaces (sysctl "
            "user.max_user_namespaces > 0, and kernel.unprivileged_userns_clone=1 or "
            "kernel.apparmor_restrict_unprivileged_userns=0 where the kernel has them); otherwise run the server "
            "as root, or accept MCPRL_SANDBOX_ISOLATION=process (no network or filesystem isolation)"
        )
    else:
        fix = "check that util-linux `unshare` works here, or accept MCPRL_SANDBOX_ISOLATION=process"
    raise SandboxUnavailableError(
        f"python sandbox unavailable ({config.isolation} isolation): {reason}; {fix}"
    )


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="mcprl-server-python", description="Python sandbox MCP server (stdio). See also MCPRL_SANDBOX_*."
    )
    parser.add_argument("--deadline-s", type=float, help="wall-clock deadline per call (default 20)")
    parser.add_argument("--cpu-s", type=int, help="RLIMIT_CPU per process (default 20)")
    parser.add_argument("--memory-mb", type=int, help="RLIMIT_AS per process in MiB (default 512)")
    parser.add_argument("--processes", type=int, help="RLIMIT_NPROC of a call (default 32)")
    parser.add_argument("--max-concurrency", type=int, help="calls at once (default: CPU cores)")
    parser.add_argument("--isolation", choices=["namespaces", "process"], help="required isolation level")
    parser.add_argument(
        "--check", action="store_true", help="run the start-up probe through the sandbox and exit"
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    """Console entry point: serve over stdio, or ``--check`` the sandbox and exit non-zero if it fails."""
    args = _parse_args(argv)
    overrides: dict[str, object] = {
        name: value
        for name, value in (
            ("deadline_s", args.deadline_s),
            ("cpu_s", args.cpu_s),
            ("memory_bytes", None if args.memory_mb is None else args.memory_mb * 1024 * 1024),
            ("processes", args.processes),
            ("max_concurrency", args.max_concurrency),
            ("isolation", args.isolation),
        )
        if value is not None
    }
    # stdout is the MCP stream: logs must go to stderr.
    structlog.configure(
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
    )
    config = SandboxConfig.from_env(**overrides)
    # A sandbox that cannot be set up refuses here, at start-up, where the caller sees a failed server; every
    # call would otherwise fail as a tool error, scored against the model.
    try:
        probe = anyio.run(check_sandbox, config)
    except SandboxUnavailableError as exc:
        sys.exit(f"refusing to start: {exc}")
    if args.check:
        print(probe)
        return
    build_server(config).run()


if __name__ == "__main__":
    main()
