"""The sandbox without root: a user namespace where the kernel allows one, a refusal at start-up where not.

The server side runs as uid 1000 of a user namespace (`unshare --user --map-user=1000`): not root, no
capability outside it, as a server started by a normal user or in a rootless container is. Its calls then
take the rootless path (a new user namespace per call) for real. Also here: what is hidden by default, and
keyrings that do not outlive a call (as root, where the throw-away uids live).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import pytest

from mcprl_servers.sandbox import SandboxConfig, run_sandboxed

_UNSHARE = shutil.which("unshare")
_AS_USER = [_UNSHARE or "unshare", "--user", "--map-user=1000", "--map-group=1000"]

_RUN = """
import anyio, json, os, sys
from mcprl_servers.sandbox import SandboxConfig, run_sandboxed
config = SandboxConfig(deadline_s=10.0, memory_cgroup="off")
out = anyio.run(run_sandboxed, sys.stdin.read(), config)
print(json.dumps({"server_euid": os.geteuid(), "status": out.status, "exit_code": out.exit_code,
                  "stdout": out.stdout.decode(), "stderr": out.stderr.decode(), "setup_error": out.setup_error}))
"""


def _user_namespaces() -> str | None:
    """Why this machine cannot run the tests (None: it can)."""
    if _UNSHARE is None:
        return "util-linux unshare is not installed"
    probe = subprocess.run([*_AS_USER, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        return f"no unprivileged user namespace here (unshare --map-user needs util-linux >= 2.38): {probe.stderr.strip()}"
    return None


pytestmark = pytest.mark.skipif(_user_namespaces() is not None, reason=str(_user_namespaces()))


def _unprivileged(code: str, cwd: Path) -> dict[str, Any]:
    """Run ``code`` through `run_sandboxed` in a server process that is uid 1000 of a user namespace."""
    proc = subprocess.run(
        [*_AS_USER, sys.executable, "-c", _RUN],
        input=code,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_without_root_the_code_runs_in_a_user_namespace_with_no_capability(tmp_path: Path) -> None:
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
caps = {k: int(v, 16) for k, v in (l.split(":") for l in open("/proc/self/status") if l.startswith("Cap"))}
print("uid", os.getuid(), "caps", sum(caps.values()))
for change in (lambda: os.setuid(1), lambda: os.setgroups([1])):
    try:
        change()
    except OSError as exc:
        print("id change", exc.strerror)
print("mount", libc.mount(b"none", b"/tmp/sandbox", b"tmpfs", 0, None), os.strerror(ctypes.get_errno()))
print("umount", libc.umount2(b"/home", 2), os.strerror(ctypes.get_errno()))
try:
    open("/etc/sandbox-write-probe", "w")
except OSError as exc:
    print("write", exc.strerror)
"""
    got = _unprivileged(code, tmp_path)
    assert got["server_euid"] == 1000
    assert (got["status"], got["exit_code"]) == ("exited", 0), got
    assert got["stdout"].splitlines() == [
        "uid 0 caps 0",
        "id change Invalid argument",  # only uid 0 exists in the call's namespace
        "id change Operation not permitted",
        "mount -1 Operation not permitted",
        "umount -1 Operation not permitted",
        "write Read-only file system",
    ], got


def test_without_root_private_trees_and_sockets_are_hidden(tmp_path: Path) -> None:
    canary = tmp_path / "canary.txt"
    canary.write_text("canary-4f1c")
    canary.chmod(0o644)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock_path = tmp_path / "open.sock"
    listener.bind(str(sock_path))
    sock_path.chmod(0o777)
    listener.listen()
    listener.setblocking(False)
    code = f"""
import os, socket
for path in ("/home", "/srv", "/mnt", "/opt", "/run"):
    print(path, os.listdir(path) if os.path.isdir(path) else "absent")
print("tmp", sorted(os.listdir("/tmp")))
print("x11", os.path.exists("/tmp/.X11-unix"))
for path in ({str(canary)!r}, os.getcwd() + "/../canary.txt"):
    try:
        print("read", open(path).read())
    except OSError as exc:
        print("read", type(exc).__name__)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    s.connect({str(sock_path)!r})
    print("socket connected")
except OSError as exc:
    print("socket", type(exc).__name__)
"""
    try:
        got = _unprivileged(code, tmp_path)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    assert got["status"] == "exited", got
    lines = got["stdout"].splitlines()
    assert lines[:5] == ["/home []", "/srv []", "/mnt []", "/opt []", "/run []"], got
    # /tmp is hidden but for the scratch dir and the interpreter's prefixes the sandbox keeps (a venv of a
    # checkout under /tmp stays reachable, read-only: the code needs its interpreter).
    kept = {
        Path(p).relative_to("/tmp").parts[0]
        for p in (sys.base_prefix, sys.exec_prefix)
        if p.startswith("/tmp/")
    }
    assert lines[5:] == [
        f"tmp {sorted({'sandbox'} | kept)}",
        "x11 False",
        "read FileNotFoundError",
        "read FileNotFoundError",
        "socket FileNotFoundError",
    ], got


def test_a_server_that_cannot_make_a_user_namespace_refuses_to_start(tmp_path: Path) -> None:
    # Root of an outer namespace allows one nested user namespace below it: the server's own. Its calls'
    # namespaces are then over the limit, as on a kernel that forbids unprivileged user namespaces.
    limited = f'echo 1 > /proc/sys/user/max_user_namespaces && exec {" ".join(_AS_USER)} "$@"'
    start = time.monotonic()
    proc = subprocess.run(
        [
            _UNSHARE or "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            limited,
            "sh",
            sys.executable,
            "-m",
            "mcprl_servers.python_sandbox",
        ],
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stdout == ""  # no MCP session was offered
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("refusing to start: python sandbox unavailable (namespaces isolation): "), last
    assert "No space left on device" in last  # the kernel's reason
    assert "unprivileged user namespaces" in last
    assert "MCPRL_SANDBOX_ISOLATION=process" in last
    assert time.monotonic() - start < 30


@pytest.mark.skipif(os.geteuid() != 0, reason="throw-away uids exist only when the server runs as root")
def test_keys_a_call_adds_to_any_keyring_do_not_outlive_it() -> None:
    code = """
import ctypes, os, platform
nr = {"x86_64": (250, 248), "aarch64": (219, 217)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
buf = ctypes.create_string_buffer(256)
libc.syscall(nr[0], 6, -3, buf, 256)  # KEYCTL_DESCRIBE of the session keyring
print(os.getuid(), buf.value.decode().rsplit(";", 1)[1])
print(libc.syscall(nr[1], b"user", b"canary", b"secret", 6, -3) > 0)  # add_key to @s
print(libc.syscall(nr[1], b"user", b"canary", b"secret", 6, -4) > 0)  # and to the uid's own keyring @u
"""
    config = SandboxConfig(deadline_s=10.0)
    outcome = anyio.run(run_sandboxed, code, config)
    assert (outcome.status, outcome.exit_code) == ("exited", 0), outcome
    first, *added = outcome.stdout.decode().splitlines()
    uid, session = first.split()
    assert (session, added) == ("_ses", ["True", "True"])  # a fresh keyring, not the uid's _uid_ses.<uid>
    deadline = time.monotonic() + 10
    while f"{uid}:" in Path("/proc/key-users").read_text() and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel frees an unreferenced keyring from a work queue: nothing to wait on
    assert f"{uid}:" not in Path("/proc/key-users").read_text()
