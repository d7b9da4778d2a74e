"""Sandbox supervisor: the process that sets up isolation and runs model code in a child.

This file is executed by path as ``python -I -S supervisor.py <json>`` inside fresh namespaces made
by ``unshare`` (or directly, in ``process`` isolation). It imports the standard library only, because
it must start before the filesystem is hidden and must not depend on the server's environment.

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
import ctypes
import json
import linecache
import math
import os
import resource
import signal
import sys
import traceback
from typing import Any

_MS_RDONLY = 0x1
_MS_NOSUID = 0x2
_MS_NODEV = 0x4
_MS_NOEXEC = 0x8
_MS_REMOUNT = 0x20
_MS_NOATIME = 0x400
_MS_NODIRATIME = 0x800
_MS_BIND = 0x1000
_MS_REC = 0x4000
_MS_PRIVATE = 0x40000
_MS_RELATIME = 0x200000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_PDEATHSIG = 1
_PR_CAPBSET_DROP = 24
_PR_SET_SECUREBITS = 28
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
# SECBIT_NOROOT, SECBIT_NO_SETUID_FIXUP, SECBIT_KEEP_CAPS_LOCKED, SECBIT_NO_CAP_AMBIENT_RAISE, each locked
# (capabilities(7)): uid 0 of the call's user namespace gains no capability back, not even through execve.
_SECUREBITS = 0b11101111
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_KEYCTL_GET_KEYRING_ID = 0
_KEYCTL_JOIN_SESSION_KEYRING = 1
_KEYCTL_CLEAR = 7
_KEYCTL_INVALIDATE = 21
_KEY_SPEC_USER_KEYRING = -4
_KEY_SPEC_USER_SESSION_KEYRING = -5
_KEYCTL_SYSCALL = {"x86_64": 250, "aarch64": 219, "riscv64": 219}  # asm-generic's number on the last two
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_MOUNT_OPTION_FLAGS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
}

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    """Isolation could not be set up; the code is not run."""


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if flags & _MS_REMOUNT and not flags & _MS_BIND:
        # A remount without MS_BIND changes the superblock, i.e. the host's filesystem.
        raise SetupError(f"refusing superblock remount of {target}")
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    if _libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        err = ctypes.get_errno()
        raise SetupError(f"mount {target}: {os.strerror(err)}")


def _unescape(path: str) -> str:
    return path.encode().decode("unicode_escape")


def _mount_points() -> list[tuple[str, int]]:
    """Mount points of this namespace with the per-mount flags to keep on a read-only remount."""
    points: list[tuple[str, int]] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            flags = 0
            for opt in fields[5].split(","):
                flags |= _MOUNT_OPTION_FLAGS.get(opt, 0)
            points.append((_unescape(fields[4]), flags))
    return points


def _remount_read_only(target: str, keep_flags: int) -> None:
    _mount(None, target, None, _MS_REMOUNT | _MS_BIND | _MS_RDONLY | keep_flags)


def _setup_filesystem(args: dict[str, Any]) -> None:
    """Make the whole tree read-only, hide private paths, mount a fresh /proc and the scratch tmpfs."""
    if os.readlink("/proc/self/ns/mnt") == args["host_mnt_ns"]:
        raise SetupError("not in a private mount namespace")
    if os.getpid() != 1:
        raise SetupError("not PID 1 of a new PID namespace")
    _mount(None, "/", None, _MS_REC | _MS_PRIVATE)
    keep_fds = {path: os.open(path, _O_PATH | os.O_DIRECTORY) for path in args["keep"] if os.path.isdir(path)}
    for target, flags in _mount_points():
        if os.path.exists(target):
            _remount_read_only(target, flags)
    _mount("proc", "/proc", "proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    scratch = args["scratch"]
    for hidden in sorted(args["hide"], key=len):
        if not os.path.isdir(hidden) or os.path.islink(hidden):
            continue
        if hidden == "/dev/shm" and args["shm_bytes"] > 0:
            # A private writable /dev/shm (POSIX semaphores for multiprocessing); gone with the call.
            opts = f"size={args['shm_bytes']},nr_inodes=256,mode=0700,uid={args['uid']},gid={args['gid']}"
            _mount("tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, opts)
            continue
        _mount("tmpfs", hidden, "tmpfs", _MS_NOSUID | _MS_NODEV, "size=1m,nr_inodes=256,mode=0755")
        for keep, fd in keep_fds.items():
            if keep.startswith(hidden.rstrip("/") + "/"):
                os.makedirs(keep, exist_ok=True)
                _mount(f"/proc/self/fd/{fd}", keep, None, _MS_BIND | _MS_REC)
                _remount_read_only(keep, _MS_NOSUID | _MS_NODEV)
        if os.path.dirname(scratch) == hidden.rstrip("/"):
            os.mkdir(scratch, 0o700)
            opts = f"size={args['scratch_bytes']},nr_inodes={args['scratch_inodes']},mode=0700"
            _mount(
                "tmpfs",
                scratch,
                "tmpfs",
                _MS_NOSUID | _MS_NODEV,
                f"{opts},uid={args['uid']},gid={args['gid']}",
            )
        _remount_read_only(hidden, _MS_NOSUID | _MS_NODEV)
    for fd in keep_fds.values():
        os.close(fd)
    if not os.path.ismount(scratch):
        raise SetupError(f"scratch {scratch} must sit directly inside a hidden directory")


def _join_cgroup(procs: str) -> None:
    """Move this process into the call's memory cgroup; the model's process, forked later, is born in it.

    The model's processes raise their OOM score to the maximum (see `_run_model_code`) and the supervisor
    lowers its own where the kernel lets it, so reaching the limit kills the model's processes and the
    supervisor reports it.
    """
    try:
        with open(procs, "w", encoding="ascii") as fh:
            fh.write("0")
    except OSError as exc:
        raise SetupError(
            f"could not join the memory cgroup {os.path.dirname(procs)}: {exc.strerror}"
        ) from exc
    _oom_score_adj(-1000)


def _oom_score_adj(value: int) -> None:
    """Best effort: some kernels (and gVisor) refuse a lower score; the model's raised one still decides."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
        fh.write(str(value))


def _limit_ipc(shm_bytes: int) -> None:
    """SysV shared memory of this IPC namespace: at most ``shm_bytes`` in all (the kernel's default is unlimited)."""
    pages = max(1, -(-shm_bytes // os.sysconf("SC_PAGE_SIZE")))
    for name, value in (("shmmax", shm_bytes), ("shmall", pages), ("shmmni", 16)):
        try:
            with open(f"/proc/sys/kernel/{name}", "w", encoding="ascii") as fh:
                fh.write(str(value))
        except OSError as exc:
            raise SetupError(
                f"could not set kernel.{name} in the call's IPC namespace: {exc.strerror}"
            ) from exc


def _set_limits(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        which = getattr(resource, f"RLIMIT_{name.upper()}")
        hard = value + 1 if name == "cpu" else value  # SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(which, (value, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


def _drop_capabilities() -> None:
    """Keep uid 0 of the call's user namespace but no capability: the rootless model process.

    Without a capability it can neither mount nor unmount nor change ids, and the bounding set and
    securebits keep ``execve`` of anything from giving one back.
    """
    if _libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
        raise SetupError(f"prctl(PR_SET_SECUREBITS): {os.strerror(ctypes.get_errno())}")
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if _libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise SetupError(f"prctl(PR_CAPBSET_DROP, {cap}): {os.strerror(ctypes.get_errno())}")
    if _libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise SetupError(f"prctl(PR_CAP_AMBIENT_CLEAR_ALL): {os.strerror(ctypes.get_errno())}")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if _libc.capset(ctypes.byref(header), data) != 0:
        raise SetupError(f"capset: {os.strerror(ctypes.get_errno())}")
    with open("/proc/self/status", encoding="ascii") as fh:
        caps = {k: v.strip() for k, v in (line.split(":", 1) for line in fh) if k.startswith("Cap")}
    if any(int(value, 16) for value in caps.values()):
        raise SetupError(f"capabilities left after dropping them all: {caps}")


def _keyctl(*args: int) -> int:
    machine = os.uname().machine
    if machine not in _KEYCTL_SYSCALL:
        raise SetupError(f"no keyctl system call number known for {machine}")
    return _libc.syscall(_KEYCTL_SYSCALL[machine], *args)


def _sweep_keyrings(uid: int, gid: int) -> bool:
    """Empty and invalidate the throw-away uid's user and user-session keyrings; True when done.

    They live in the kernel for as long as the uid's user namespace (the host's) does, whatever the call
    put in them. Every other process of the call is killed first, so none adds a key after the sweep.
    """
    if os.getpid() != 1:  # kill(-1) below must reach the call's processes only
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(-1, signal.SIGKILL)  # PID 1 of its namespace: every process of the call but this one
    with contextlib.suppress(ChildProcessError):
        while True:
            os.waitpid(-1, 0)
    pid = os.fork()
    if pid == 0:
        done = False
        with contextlib.suppress(BaseException):
            os.setgroups([])
            os.setresgid(gid, gid, gid)
            os.setresuid(uid, uid, uid)
            done = sweep_own_keyrings()
        os._exit(0 if done else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


def sweep_own_keyrings() -> bool:
    """Empty and invalidate this process's uid's user and user-session keyrings; True when done.

    Run as the throw-away uid: by the supervisor after the code exits, and by the server (`sweep_main`) after
    a call it killed, which the supervisor did not outlive. Both ids are looked up before either is
    invalidated: looking one up re-creates a missing or invalid other.
    """
    rings = [
        _keyctl(_KEYCTL_GET_KEYRING_ID, spec, 0)
        for spec in (_KEY_SPEC_USER_KEYRING, _KEY_SPEC_USER_SESSION_KEYRING)
    ]
    return all(
        r > 0 and _keyctl(_KEYCTL_CLEAR, r) == 0 and _keyctl(_KEYCTL_INVALIDATE, r) == 0 for r in rings
    )


def _join_new_session_keyring() -> None:
    """A fresh anonymous session keyring: keys the code adds to ``@s`` die with the call instead of landing
    in the uid's persistent user-session keyring."""
    if _keyctl(_KEYCTL_JOIN_SESSION_KEYRING, 0) < 0:
        raise SetupError(f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {os.strerror(ctypes.get_errno())}")


def _drop_privileges(uid: int, gid: int, *, rootless: bool) -> None:
    if rootless:
        _drop_capabilities()
    elif os.getuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if 0 in os.getresuid() or 0 in os.getresgid():
            raise SetupError("could not drop root")
    if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SetupError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    # Set after the uid change (which clears it): die with the supervisor.
    if _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise SetupError("prctl(PR_SET_PDEATHSIG) failed")
    _join_new_session_keyring()


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
            _oom_score_adj(1000)
        _set_limits(args["limits"])
        _drop_privileges(args["uid"], args["gid"], rootless=args["rootless"])
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
            _join_cgroup(args["cgroup_procs"])
        if args["mode"] == "namespaces":
            _limit_ipc(args["shm_bytes"])
            _setup_filesystem(args)
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
        event["keyrings_swept"] = _sweep_keyrings(args["uid"], args["gid"])
    _report(status_fd, event)
    os._exit(0)


def sweep_main(uid: int, gid: int) -> int:
    """``supervisor.py --sweep-keyrings <uid> <gid>``, started as root: drop to the uid, sweep its keyrings."""
    os.setgroups([])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    return 0 if sweep_own_keyrings() else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["--sweep-keyrings"]:
        sys.exit(sweep_main(int(sys.argv[2]), int(sys.argv[3])))
    main()
