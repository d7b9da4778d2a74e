"""The call's resource limits: its memory cgroup, SysV shared memory, rlimits and OOM scores."""

from __future__ import annotations

import contextlib
import os
import resource

from .system import SetupError

__all__ = ["join_cgroup", "limit_ipc", "oom_score_adj", "set_limits"]


def join_cgroup(procs: str) -> None:
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
    oom_score_adj(-1000)


def oom_score_adj(value: int) -> None:
    """Best effort: some kernels (and gVisor) refuse a lower score; the model's raised one still decides."""
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w", encoding="ascii") as fh:
        fh.write(str(value))


def limit_ipc(shm_bytes: int) -> None:
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


def set_limits(limits: dict[str, int]) -> None:
    for name, value in limits.items():
        which = getattr(resource, f"RLIMIT_{name.upper()}")
        hard = value + 1 if name == "cpu" else value  # SIGXCPU at the soft limit, SIGKILL one second later
        resource.setrlimit(which, (value, hard))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
