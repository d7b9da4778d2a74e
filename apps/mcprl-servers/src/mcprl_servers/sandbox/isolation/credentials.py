"""The model process's credentials: capabilities, uid/gid, no-new-privs, and the keyrings a throw-away uid
leaves in the kernel."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal

from .system import SetupError, errno_text, libc

__all__ = ["drop_privileges", "sweep_keyrings", "sweep_own_keyrings"]

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
    if libc.prctl(_PR_SET_SECUREBITS, _SECUREBITS, 0, 0, 0) != 0:
        raise SetupError(f"prctl(PR_SET_SECUREBITS): {errno_text()}")
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        if libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise SetupError(f"prctl(PR_CAPBSET_DROP, {cap}): {errno_text()}")
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        raise SetupError(f"prctl(PR_CAP_AMBIENT_CLEAR_ALL): {errno_text()}")
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capset(ctypes.byref(header), data) != 0:
        raise SetupError(f"capset: {errno_text()}")
    with open("/proc/self/status", encoding="ascii") as fh:
        caps = {k: v.strip() for k, v in (line.split(":", 1) for line in fh) if k.startswith("Cap")}
    if any(int(value, 16) for value in caps.values()):
        raise SetupError(f"capabilities left after dropping them all: {caps}")


def _keyctl(*args: int) -> int:
    machine = os.uname().machine
    if machine not in _KEYCTL_SYSCALL:
        raise SetupError(f"no keyctl system call number known for {machine}")
    return libc.syscall(_KEYCTL_SYSCALL[machine], *args)


def sweep_keyrings(uid: int, gid: int) -> bool:
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
        raise SetupError(f"keyctl(KEYCTL_JOIN_SESSION_KEYRING): {errno_text()}")


def drop_privileges(uid: int, gid: int, *, rootless: bool) -> None:
    if rootless:
        _drop_capabilities()
    elif os.getuid() == 0:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
        if 0 in os.getresuid() or 0 in os.getresgid():
            raise SetupError("could not drop root")
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise SetupError("prctl(PR_SET_NO_NEW_PRIVS) failed")
    # Set after the uid change (which clears it): die with the supervisor.
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise SetupError("prctl(PR_SET_PDEATHSIG) failed")
    _join_new_session_keyring()
