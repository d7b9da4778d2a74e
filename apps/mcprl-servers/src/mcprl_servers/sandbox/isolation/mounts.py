"""The call's filesystem: every mount read-only, private paths hidden, a fresh /proc, the scratch tmpfs.

Runs in the supervisor, PID 1 of the call's PID namespace and root of its private mount namespace; nothing here
touches the host's mounts (bind remounts only; a superblock remount is refused).
"""

from __future__ import annotations

import ctypes
import os
from typing import Any

from .system import SetupError, libc

__all__ = ["setup_filesystem"]

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
_O_PATH = getattr(os, "O_PATH", 0o10000000)
_MOUNT_OPTION_FLAGS = {
    "nosuid": _MS_NOSUID,
    "nodev": _MS_NODEV,
    "noexec": _MS_NOEXEC,
    "noatime": _MS_NOATIME,
    "nodiratime": _MS_NODIRATIME,
    "relatime": _MS_RELATIME,
}


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if flags & _MS_REMOUNT and not flags & _MS_BIND:
        # A remount without MS_BIND changes the superblock, i.e. the host's filesystem.
        raise SetupError(f"refusing superblock remount of {target}")
    encode = lambda s: None if s is None else s.encode()  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
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


def setup_filesystem(args: dict[str, Any]) -> None:
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
