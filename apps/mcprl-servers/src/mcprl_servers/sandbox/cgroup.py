"""A memory cgroup per sandbox call: the kernel bounds everything the call holds, not one process's address space.

``RLIMIT_AS`` bounds the address space of each process of a call; pages the call holds outside it (memfd,
SysV and POSIX shared memory, files on its tmpfs) escape it, and so does a second process. The kernel
charges every page to the memory cgroup of the process that touched it, so one cgroup per call with a
limit bounds all of it, and the kernel's OOM killer kills inside the cgroup when the call reaches it.

Protocol: `CallCgroup.create` makes ``<the server's own memory cgroup>/mcprl-sandbox-<random>`` and writes
the limit (v2: ``memory.max`` and ``memory.swap.max``; v1: ``memory.limit_in_bytes`` and, where swap is
accounted, ``memory.memsw.limit_in_bytes``); the supervisor writes ``0`` to its ``cgroup.procs`` (joins)
before it forks the model's process, so every process of the call is inside; after the call,
`CallCgroup.oom_kills` reads the kernel's count of OOM kills and `CallCgroup.remove` deletes the directory;
a server killed mid-call leaves its (empty) cgroup behind, and `sweep_stale` removes those at the next
server's start.
`memory_hierarchy` finds where the server may create such cgroups: None where it cannot (no memory
controller, a read-only hierarchy, cgroup v2 without the memory controller delegated to the server's
cgroup), and then calls run with the rlimits alone.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from pathlib import Path

import attrs

__all__ = ["CallCgroup", "memory_hierarchy", "sweep_stale"]

_REMOVE_WAIT_S = 2.0
_PREFIX = "mcprl-sandbox-"


def sweep_stale(parent: Path) -> int:
    """Remove the call cgroups left under ``parent`` by servers that died mid-call; returns how many.

    A cgroup's name carries the pid of the server that made it (``mcprl-sandbox-<pid>-<random>``), so a
    live server's cgroups, even one just made and not yet joined, are never touched.
    """
    removed = 0
    for path in parent.glob(f"{_PREFIX}*-*"):
        pid = path.name.removeprefix(_PREFIX).split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        with contextlib.suppress(OSError):
            path.rmdir()
            removed += 1
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _mounts() -> list[tuple[str, str, str, set[str]]]:
    """``(root within the hierarchy, mount point, fs type, super options)`` of each cgroup mount."""
    found: list[tuple[str, str, str, set[str]]] = []
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            dash = fields.index("-")
            fstype, options = fields[dash + 1], set(fields[dash + 3].split(","))
            if fstype in ("cgroup", "cgroup2"):
                found.append((fields[3], fields[4], fstype, options))
    return found


def _inside(mount_root: str, mount_point: str, path: str) -> Path | None:
    if mount_root != "/" and not (path == mount_root or path.startswith(mount_root.rstrip("/") + "/")):
        return None
    return Path(mount_point) / path[len(mount_root.rstrip("/")) :].lstrip("/")


def memory_hierarchy() -> tuple[Path, int] | None:
    """The directory of this process's memory cgroup and the cgroup version, if children can be made there."""
    own = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(",") if controllers else [""]:
                own[name] = path
    for mount_root, mount_point, fstype, options in _mounts():
        if fstype == "cgroup" and "memory" in options and "memory" in own:
            directory = _inside(mount_root, mount_point, own["memory"])
            if directory is not None and os.access(directory, os.W_OK):
                return directory, 1
        if fstype == "cgroup2" and "" in own:
            directory = _inside(mount_root, mount_point, own[""])
            if directory is None or not os.access(directory, os.W_OK):
                continue
            with contextlib.suppress(OSError):
                if "memory" in (directory / "cgroup.subtree_control").read_text().split():
                    return directory, 2
    return None


@attrs.frozen
class CallCgroup:
    """One call's memory cgroup (see the module docstring for the protocol)."""

    path: Path
    version: int

    @classmethod
    def create(cls, parent: Path, version: int, limit_bytes: int) -> CallCgroup:
        """A new cgroup under ``parent`` holding at most ``limit_bytes`` of memory, swap included.

        Raises:
            OSError: The directory or a limit could not be written.
        """
        path = parent / f"{_PREFIX}{os.getpid()}-{secrets.token_hex(6)}"
        path.mkdir(mode=0o700)
        cgroup = cls(path, version)
        try:
            if version == 2:
                (path / "memory.max").write_text(str(limit_bytes))
                if (path / "memory.swap.max").exists():
                    (path / "memory.swap.max").write_text("0")
            else:
                (path / "memory.limit_in_bytes").write_text(str(limit_bytes))
                if (path / "memory.memsw.limit_in_bytes").exists():
                    (path / "memory.memsw.limit_in_bytes").write_text(str(limit_bytes))
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    @property
    def procs(self) -> Path:
        """The file a process writes ``0`` to in order to join."""
        return self.path / "cgroup.procs"

    def oom_kills(self) -> int:
        """How many processes of the call the kernel killed for reaching the limit."""
        events = self.path / ("memory.events" if self.version == 2 else "memory.oom_control")
        with contextlib.suppress(OSError, ValueError):
            for line in events.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return 0

    def remove(self) -> None:
        """Delete the cgroup once its processes are gone (waits briefly for the last ones to be reaped)."""
        deadline = time.monotonic() + _REMOVE_WAIT_S
        while True:
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
