"""Sandbox supervisor: the process that sets up isolation and runs model code in a child.

This file is executed by path as ``python -I -S supervisor.py <json>`` inside fresh namespaces made
by ``unshare`` (or directly, in ``process`` isolation). It imports the standard library only, because
it must start before the filesystem is hidden and must not depend on the server's environment. The isolation
steps are the ``isolation`` folder beside it (`mcprl_servers.sandbox.isolation`), imported from there before
anything is hidden; this file is the process: the protocol, the fork, the model's code, the exit report.

Protocol: the server writes the code to stdin and closes it; the supervisor reports JSON lines on the
status descriptor (``setup_failed`` / ``started`` / ``exited``). Model code inherits stdout/stderr but
never the status descriptor, so it cannot forge its own exit status.

In ``namespaces`` isolation the supervisor is PID 1 of a new PID namespace and stays root there: the
model's process runs under a throw-away unprivileged uid, so it can neither signal nor trace the
supervisor. When the model's process exits the supervisor exits, and the kernel kills every other
process of the namespace (background children, double forks, ``setsid`` escapes) before the server
sees the exit.
"""

from __future__ import annotations

import builtins
import contextlib
import json
import linecache
import math
import os
import resource
import signal
import sys
import traceback
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mcprl_servers.sandbox.isolation import credentials, limits, mounts
    from mcprl_servers.sandbox.isolation.system import SetupError
else:
    # Run by path with -I, so no package holds this file and its folder is not on sys.path: put it there for
    # the isolation package alone, and take it off again before the model's code can see it.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from isolation import credentials, limits, mounts
    from isolation.system import SetupError

    del sys.path[0]


def _run_model_code(code: bytes, args: dict[str, Any], setup_fd: int) -> None:
    """Child side: limits, privileges, then the model's code. Never returns.

    A setup failure is written to ``setup_fd``; the child closes it before the model's code runs, so
    nothing that code writes or exits with can pass for the sandbox failing (see `_await_child_setup`).
    """
    status = 1
    supervisor = os.getppid()
    try:
        if args["mode"] == "namespaces":
            os.setsid()  # in ``process`` mode the child stays in the session the server kills
        os.close(args["status_fd"])
        devnull = os.open("/dev/null", os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(args["scratch"])
        os.umask(0o077)
        if args["cgroup_procs"] is not None:
            limits.oom_score_adj(1000)
        limits.set_limits(args["limits"])
        credentials.drop_privileges(args["uid"], args["gid"], rootless=args["rootless"])
        if os.getppid() != supervisor:
            raise SetupError("the supervisor died")
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.write(setup_fd, f"could not prepare the child: {exc}".encode(errors="replace"))
        os._exit(125)
    os.close(setup_fd)
    os.environ.clear()
    # Line-buffered, so output printed before a hang or a kill still reaches the server.
    sys.stdout.reconfigure(line_buffering=True)  # pyright: ignore[reportAttributeAccessIssue]
    sys.argv = ["<run_python>"]
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
    source = code.decode("utf-8", errors="replace")
    linecache.cache["<run_python>"] = (len(source), None, source.splitlines(True), "<run_python>")
    try:
        exec(compile(code, "<run_python>", "exec"), namespace)
        status = 0
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException as exc:
        tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # skip this frame
        traceback.print_exception(type(exc), exc, tb)
        status = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):  # a closed or broken stream must not hide the status
            stream.flush()
    os._exit(status & 0xFF)


def _await_child_setup(fd: int) -> str:
    """Read the child's setup channel to its end: empty when the child closed it to run the model's code."""
    chunks: list[bytes] = []
    while chunk := os.read(fd, 4096):
        chunks.append(chunk)
    os.close(fd)
    return b"".join(chunks).decode(errors="replace")


def _report(fd: int, event: dict[str, Any]) -> None:
    os.write(fd, (json.dumps(event) + "\n").encode())


def main() -> None:
    """Entry point: read the code, isolate, run it in a child, report its exit."""
    args = json.loads(sys.argv[1])
    status_fd = args["status_fd"]
    # /proc is still the host's here: report our host pid so the server can wait for our exit,
    # which (as PID 1) comes only after the kernel has killed the rest of the namespace.
    _report(status_fd, {"event": "supervisor", "host_pid": int(os.readlink("/proc/self"))})
    code = sys.stdin.buffer.read()
    try:
        if args["cgroup_procs"] is not None:
            limits.join_cgroup(args["cgroup_procs"])
        if args["mode"] == "namespaces":
            limits.limit_ipc(args["shm_bytes"])
            mounts.setup_filesystem(args)
    except (SetupError, OSError) as exc:
        _report(status_fd, {"event": "setup_failed", "error": str(exc)})
        os._exit(0)
    sys.stdout.flush()
    # Backstop if the server dies without killing us: exiting PID 1 kills the whole namespace.
    signal.signal(signal.SIGALRM, lambda *_: os._exit(0))
    signal.alarm(math.ceil(args["deadline_s"]) + 2)
    setup_r, setup_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(setup_r)
        _run_model_code(code, args, setup_w)
    os.close(setup_w)
    failure = _await_child_setup(setup_r)
    if failure:
        os.waitpid(pid, 0)
        _report(status_fd, {"event": "setup_failed", "error": failure})
        os._exit(0)
    _report(status_fd, {"event": "started"})
    while True:
        # As PID 1 this loop also reaps orphans; it ends when the model's own process exits.
        done, wait_status, _ = os.wait3(0)
        if done == pid:
            break
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    exit_code = os.waitstatus_to_exitcode(wait_status)
    event: dict[str, Any] = {"event": "exited", "exit_code": exit_code, "peak_rss_kib": peak_kib}
    if args["mode"] == "namespaces" and not args["rootless"]:
        # Without root the call's own user namespace holds its keyrings, and they go with it.
        event["keyrings_swept"] = credentials.sweep_keyrings(args["uid"], args["gid"])
    _report(status_fd, event)
    os._exit(0)


def sweep_main(uid: int, gid: int) -> int:
    """``supervisor.py --sweep-keyrings <uid> <gid>``, started as root: drop to the uid, sweep its keyrings."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    return 0 if credentials.sweep_own_keyrings() else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sweep-keyrings"]:
        sys.exit(sweep_main(int(sys.argv[2]), int(sys.argv[3])))
    main()
