"""Server side of the sandbox: start the supervisor, stream its output under a cap, enforce the deadline.

The server never runs model code. Each call starts ``unshare`` (``namespaces`` isolation) or the
supervisor directly (``process``) in a new session, feeds the code on stdin, reads stdout and stderr
while it runs (at most ``output_cap_bytes`` in total: beyond that the call is killed), and kills the
whole session at the wall-clock deadline. In ``namespaces`` isolation killing the session kills the
PID namespace's init, which makes the kernel kill every process of the call.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import anyio
import attrs
from anyio.abc import ByteReceiveStream, Process
from structlog import get_logger

from mcprl_servers.sandbox.cgroup import CallCgroup, memory_hierarchy, sweep_stale
from mcprl_servers.sandbox.config import SandboxConfig

_SUPERVISOR = Path(__file__).with_name("supervisor.py")
_REAP_GRACE_S = 5.0
_log = get_logger()

Status = Literal["exited", "timed_out", "output_capped", "setup_failed"]


@attrs.frozen(kw_only=True)
class RunOutcome:
    """What one sandboxed run produced.

    Attributes:
        status: ``exited`` (the code's process ended by itself), ``timed_out`` (killed at the deadline),
            ``output_capped`` (killed for exceeding the output cap) or ``setup_failed`` (isolation could
            not be set up; the code was not run).
        exit_code: Exit status of the code's process; negative for a signal; None unless ``exited``.
        stdout: Captured stdout, at most the cap.
        stderr: Captured stderr, at most the cap.
        output_bytes: Total bytes the code wrote to stdout and stderr before it was stopped.
        setup_error: Why isolation failed, for ``setup_failed``.
        peak_rss_kib: Largest resident set of any process of the call, when the supervisor reported it.
        wall_s: Wall time of the call.
        oom_killed: The kernel killed a process of the call for reaching its memory cgroup's limit.
    """

    status: Status
    exit_code: int | None
    stdout: bytes
    stderr: bytes
    output_bytes: int
    setup_error: str | None
    peak_rss_kib: int | None
    wall_s: float
    oom_killed: bool = False


@attrs.define
class _Capture:
    cap: int
    stdout: bytearray = attrs.field(factory=bytearray)
    stderr: bytearray = attrs.field(factory=bytearray)
    total: int = 0
    capped: bool = False
    events: list[dict[str, Any]] = attrs.field(factory=list)
    supervisor_pidfd: int | None = None


def rootless() -> bool:
    """The server runs without root: ``namespaces`` isolation then starts in a new user namespace.

    The supervisor is root of that namespace only (mapped to the server's own uid), which is what it needs
    to mount and to set the IPC limits; the model's process keeps uid 0 there but no capability at all.
    """
    return os.geteuid() != 0


def _command(config: SandboxConfig, args: dict[str, Any]) -> list[str]:
    python = [os.path.realpath(sys.executable), "-I", "-S", "-B", str(_SUPERVISOR), json.dumps(args)]
    match config.isolation:
        case "namespaces":
            if config.unshare_path is None:
                raise FileNotFoundError("the util-linux `unshare` binary was not found on PATH")
            flags = ["--pid", "--net", "--mount", "--ipc", "--uts", "--fork", "--kill-child"]
            user = ["--user", "--map-root-user"] if args["rootless"] else []
            return [config.unshare_path, *user, *flags, "--propagation", "private", "--", *python]
        case "process":
            return python


def _throwaway_ids(config: SandboxConfig) -> tuple[int, int]:
    if rootless():
        # In a user namespace only root is mapped; as a plain process the uid is the server's own.
        return (0, 0) if config.isolation == "namespaces" else (os.getuid(), os.getgid())
    low, high = config.uid_range
    uid = low + secrets.randbelow(high - low)
    return uid, uid


async def _pump(stream: ByteReceiveStream | None, sink: bytearray, capture: _Capture, kill: Any) -> None:
    if stream is None:
        return
    async for chunk in stream:
        room = capture.cap - capture.total
        if room > 0:
            sink += chunk[:room]
        capture.total += len(chunk)
        if capture.total > capture.cap and not capture.capped:
            capture.capped = True
            await kill()


async def _read_status(fd: int, capture: _Capture) -> None:
    pending = b""
    while True:
        await anyio.wait_readable(fd)
        chunk = os.read(fd, 65536)
        if not chunk:
            return
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in filter(None, lines):
            event = json.loads(line)
            capture.events.append(event)
            if event["event"] == "supervisor" and capture.supervisor_pidfd is None:
                with contextlib.suppress(ProcessLookupError):
                    capture.supervisor_pidfd = os.pidfd_open(event["host_pid"])


async def _feed(process: Process, code: bytes) -> None:
    assert process.stdin is not None
    try:
        await process.stdin.send(code)
        await process.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass  # the supervisor is gone (e.g. unshare failed); its stderr says why


async def _sweep_uid(uid: int) -> None:
    """Kill every process of a throw-away uid (``process`` isolation only: escapees of the session)."""
    kill = shutil.which("kill")
    if kill is None or uid == 0 or os.geteuid() != 0:
        return
    # kill(-1) as the throw-away uid reaches only that uid's processes; Popen drops to it before exec.
    await anyio.run_process(
        [kill, "-KILL", "--", "-1"], user=uid, group=uid, extra_groups=[], env={}, check=False
    )


async def _sweep_keyrings(uid: int, gid: int) -> bool:
    """Empty and invalidate a throw-away uid's user keyrings from outside the call; True when done.

    The supervisor sweeps them when the code exits by itself; a call killed at its deadline, for its output
    or with its supervisor leaves them (and every key the code put there) in the kernel, where they count
    against the per-user key quota for as long as the host runs. A process of that uid is the one that can
    reach them (``@u``, ``@us``): the supervisor's file, started as root, drops to the uid to sweep them
    (the uid itself may not be able to execute the interpreter).
    """
    if uid == 0 or os.geteuid() != 0:
        return True  # no throw-away uid: rootless calls' keyrings go with their user namespace
    done = await anyio.run_process(_sweep_command(uid, gid), env={}, cwd="/", check=False)
    return done.returncode == 0


def _sweep_command(uid: int, gid: int) -> list[str]:
    python = [os.path.realpath(sys.executable), "-I", "-S", "-B", str(_SUPERVISOR)]
    return [*python, "--sweep-keyrings", str(uid), str(gid)]


def _call_cgroup(config: SandboxConfig) -> CallCgroup | None:
    """This call's memory cgroup, per ``config.memory_cgroup``.

    Raises:
        OSError: ``required`` and none can be made here (the reason says why).
    """
    if config.memory_cgroup == "off":
        return None
    hierarchy = _hierarchy()
    if hierarchy is None:
        if config.memory_cgroup == "required":
            raise OSError(
                "no writable memory cgroup hierarchy for this server (cgroup v1 memory controller, or v2 with "
                "memory in the server's cgroup.subtree_control); set MCPRL_SANDBOX_MEMORY_CGROUP=auto to run "
                "with rlimits only"
            )
        return None
    return CallCgroup.create(*hierarchy, config.memory_bytes)


@functools.cache
def _hierarchy() -> tuple[Path, int] | None:
    found = memory_hierarchy()
    stale = sweep_stale(found[0]) if found else 0
    _log.info(
        "sandbox_memory_cgroup",
        where=str(found[0]) if found else None,
        version=found and found[1],
        swept=stale,
    )
    return found


def _outcome(capture: _Capture, timed_out: bool, wall_s: float, oom_killed: bool) -> RunOutcome:
    events = {event["event"]: event for event in capture.events}
    exited = events.get("exited", {})
    status: Status
    if "setup_failed" in events or "started" not in events:
        status = "setup_failed"
    elif capture.capped:
        status = "output_capped"
    elif "exited" in events:
        status = "exited"
    else:
        status = "timed_out" if timed_out else "setup_failed"
    setup_error = None
    if status == "setup_failed":
        reason = events.get("setup_failed", {}).get("error") or bytes(capture.stderr).decode(errors="replace")
        setup_error = reason.strip() or "the sandbox supervisor exited before starting the code"
    return RunOutcome(
        status=status,
        exit_code=exited.get("exit_code") if status == "exited" else None,
        stdout=bytes(capture.stdout),
        stderr=bytes(capture.stderr),
        output_bytes=capture.total,
        setup_error=setup_error,
        peak_rss_kib=exited.get("peak_rss_kib"),
        wall_s=wall_s,
        oom_killed=oom_killed,
    )


async def run_sandboxed(code: str, config: SandboxConfig) -> RunOutcome:
    """Run ``code`` in a fresh sandboxed process tree and wait for it (at most ``config.deadline_s``).

    Raises:
        OSError: The supervisor could not be started at all (e.g. no ``unshare`` binary).
    """
    uid, gid = _throwaway_ids(config)
    scratch = config.scratch_dir
    if config.isolation == "process":
        scratch = tempfile.mkdtemp(prefix="mcprl-sandbox-")
        os.chown(scratch, uid, gid)
    try:
        cgroup = _call_cgroup(config)
    except BaseException:
        if config.isolation == "process":
            shutil.rmtree(scratch, ignore_errors=True)
        raise
    status_r, status_w = os.pipe()
    args = {
        "cgroup_procs": None if cgroup is None else str(cgroup.procs),
        "mode": config.isolation,
        "rootless": config.isolation == "namespaces" and rootless(),
        "status_fd": status_w,
        "host_mnt_ns": os.readlink("/proc/self/ns/mnt"),
        "uid": uid,
        "gid": gid,
        "hide": list(config.hidden_paths),
        "keep": [sys.base_prefix, sys.exec_prefix],
        "scratch": scratch,
        "scratch_bytes": config.scratch_bytes,
        "scratch_inodes": config.scratch_inodes,
        "shm_bytes": config.shm_bytes,
        "limits": config.limits(),
        "deadline_s": config.deadline_s,
    }
    capture = _Capture(cap=config.output_cap_bytes)
    start = time.monotonic()
    try:
        process = await anyio.open_process(
            _command(config, args),
            stdin=subprocess.PIPE,
            env={},
            cwd="/",
            start_new_session=True,
            pass_fds=(status_w,),
        )
    except BaseException:
        os.close(status_r)
        if config.isolation == "process":
            shutil.rmtree(scratch, ignore_errors=True)
        if cgroup is not None:
            cgroup.remove()
        raise
    finally:
        os.close(status_w)
    _log.debug("sandbox_started", pid=process.pid, isolation=config.isolation, uid=uid)

    async def kill() -> None:
        pidfd = capture.supervisor_pidfd
        if config.isolation == "namespaces" and pidfd is not None and process.returncode is None:
            # Kill the namespace's init first (race-free via its pidfd): the kernel kills the rest,
            # and unshare, still alive, reaps it, so no orphan is left for the host's init.
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            with anyio.move_on_after(_REAP_GRACE_S):
                await process.wait()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        if config.isolation == "process":
            await _sweep_uid(uid)

    timed_out = oom_killed = False
    try:
        with anyio.move_on_after(config.deadline_s) as scope:
            async with anyio.create_task_group() as tg:
                tg.start_soon(_pump, process.stdout, capture.stdout, capture, kill)
                tg.start_soon(_pump, process.stderr, capture.stderr, capture, kill)
                tg.start_soon(_read_status, status_r, capture)
                await _feed(process, code.encode("utf-8", errors="surrogateescape"))
                await process.wait()
                if config.isolation == "process":
                    await _sweep_uid(uid)  # background children would otherwise hold the pipes open
        timed_out = scope.cancelled_caught
    finally:
        with anyio.CancelScope(shield=True):
            await kill()
            with anyio.move_on_after(_REAP_GRACE_S):
                await process.wait()
                if capture.supervisor_pidfd is not None:
                    # unshare may die first when killed; the namespace is empty once its init has exited.
                    await anyio.wait_readable(capture.supervisor_pidfd)
            if capture.supervisor_pidfd is not None:
                os.close(capture.supervisor_pidfd)
            await process.aclose()
            os.close(status_r)
            if config.isolation == "process":
                shutil.rmtree(scratch, ignore_errors=True)
            if cgroup is not None:
                oom_killed = cgroup.oom_kills() > 0
                await anyio.to_thread.run_sync(cgroup.remove)
            swept = any(e["event"] == "exited" and e.get("keyrings_swept") for e in capture.events)
            if not swept and not await _sweep_keyrings(uid, gid):
                _log.warning("sandbox_keyrings_not_swept", uid=uid)
    outcome = _outcome(capture, timed_out, time.monotonic() - start, oom_killed)
    if any(e["event"] == "exited" and e.get("keyrings_swept") is False for e in capture.events):
        _log.warning("sandbox_keyrings_not_swept", uid=uid)
    _log.debug("sandbox_finished", status=outcome.status, exit_code=outcome.exit_code, wall_s=outcome.wall_s)
    return outcome
