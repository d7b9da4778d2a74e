"""Configuration of the Python sandbox: limits and the isolation level the server requires.

Limits belong to whoever starts the server (environment variables or command-line flags), never to the
model: ``run_python`` takes only ``code``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any, Literal

import attrs

MemoryCgroup = Literal["auto", "required", "off"]
"""Whether each call gets a memory cgroup bounding all it holds (see ``SandboxConfig.memory_cgroup``)."""
Isolation = Literal["namespaces", "process"]
"""``namespaces``: PID, network, mount, IPC and UTS namespaces, read-only filesystem; as root a throw-away uid,
without root a new user namespace whose uid 0 the code keeps with no capability (the kernel must allow
unprivileged user namespaces; the server refuses to start otherwise). ``process``: own session, rlimits, empty
environment, scratch dir and, as root, a throw-away uid — no network or filesystem isolation. Opt-in only."""

_MIB = 1024 * 1024
DEFAULT_HIDDEN_PATHS = (
    "/root",
    "/home",
    "/tmp",
    "/var/tmp",
    "/dev/shm",
    "/run",
    "/var/run",
    "/mnt",
    "/media",
    "/srv",
    "/opt",
)
"""Hidden from model code by default: home directories, world-writable dirs and their sockets (``/tmp/.X11-unix``,
``/run``, ``/var/run`` where it is no link to ``/run``), mounts and add-on trees; the Python installation the code
runs on is bound back read-only wherever it lives (``/opt/python``, ``/root/.pyenv``)."""
ENV_PREFIX = "MCPRL_SANDBOX_"
_SYSTEM_PATHS = frozenset(
    {"/", "/bin", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/proc", "/sbin", "/sys", "/usr"}
)


def _positive(_instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


def _absolute_paths(_instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...]) -> None:
    for path in value:
        if not os.path.isabs(path):
            raise ValueError(f"{attribute.name}: {path!r} is not an absolute path")
        if os.path.normpath(path) in _SYSTEM_PATHS:
            raise ValueError(f"{attribute.name}: {path!r} is a system directory the sandbox needs")


def _scratch_in_hidden(instance: SandboxConfig, _attribute: attrs.Attribute[Any], value: str) -> None:
    if os.path.dirname(value) not in {p.rstrip("/") for p in instance.hidden_paths}:
        raise ValueError(f"scratch_dir {value!r} must sit directly inside one of hidden_paths")


def _uid_range(_instance: object, _attribute: attrs.Attribute[Any], value: tuple[int, int]) -> None:
    low, high = value
    if not 0 < low < high:
        raise ValueError(f"uid_range must satisfy 0 < low < high, got {value!r}")


def _hidden_defaults() -> tuple[str, ...]:
    cwd = os.getcwd()  # where run files and checkpoints usually live
    return DEFAULT_HIDDEN_PATHS if cwd in _SYSTEM_PATHS else (*DEFAULT_HIDDEN_PATHS, cwd)


def _default_concurrency() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@attrs.frozen(kw_only=True)
class SandboxConfig:
    """Limits and isolation for each ``run_python`` call.

    Attributes:
        deadline_s: Wall-clock deadline of one call; everything the call started is killed at it.
        cpu_s: RLIMIT_CPU per process (SIGXCPU at the limit, SIGKILL one second later).
        memory_bytes: RLIMIT_AS per process, and the whole call's memory (every process, memfd, shared
            memory, tmpfs pages) where a memory cgroup is used (see ``memory_cgroup``).
        memory_cgroup: ``auto``: bound each call with a memory cgroup where the server can create one
            (`mcprl_servers.sandbox.cgroup`), else rely on the rlimits; ``required``: refuse to run code
            without one; ``off``: rlimits only.
        file_size_bytes: RLIMIT_FSIZE: the largest file a process may write.
        scratch_bytes: Size of the scratch tmpfs (the only writable place; ``namespaces`` only).
        scratch_inodes: Inode quota of the scratch tmpfs.
        shm_bytes: Size of the private writable ``/dev/shm`` (for multiprocessing); 0 keeps it read-only.
        open_files: RLIMIT_NOFILE.
        processes: RLIMIT_NPROC of the throw-away uid (processes and threads of one call).
        output_cap_bytes: Hard cap on stdout+stderr read by the server; the call is killed beyond it.
        result_chars: Most characters of output put into one tool result (head, with a marker).
        error_tail_chars: Characters of stderr (traceback tail) shown in a tool error.
        max_code_bytes: Largest accepted ``code`` argument.
        max_concurrency: Calls running at once (default: usable CPU cores).
        isolation: Required isolation level; if it cannot be set up the call fails, code is not run.
        hidden_paths: Directories replaced by empty read-only tmpfs mounts (``namespaces`` only).
        scratch_dir: Working directory of the code; must sit directly in one of ``hidden_paths``.
        uid_range: Range from which each call draws a throw-away uid when the server runs as root.
        unshare_path: The util-linux ``unshare`` binary (``namespaces`` only).
    """

    deadline_s: float = attrs.field(default=20.0, validator=_positive)
    cpu_s: int = attrs.field(default=20, validator=_positive)
    memory_bytes: int = attrs.field(default=512 * _MIB, validator=_positive)
    file_size_bytes: int = attrs.field(default=16 * _MIB, validator=_positive)
    scratch_bytes: int = attrs.field(default=64 * _MIB, validator=_positive)
    scratch_inodes: int = attrs.field(default=4096, validator=_positive)
    shm_bytes: int = attrs.field(default=8 * _MIB, validator=attrs.validators.ge(0))
    open_files: int = attrs.field(default=256, validator=_positive)
    processes: int = attrs.field(default=16, validator=_positive)
    output_cap_bytes: int = attrs.field(default=_MIB, validator=_positive)
    result_chars: int = attrs.field(default=16_384, validator=_positive)
    error_tail_chars: int = attrs.field(default=2_000, validator=_positive)
    max_code_bytes: int = attrs.field(default=256 * 1024, validator=_positive)
    max_concurrency: int = attrs.field(factory=_default_concurrency, validator=_positive)
    isolation: Isolation = attrs.field(
        default="namespaces", validator=attrs.validators.in_(("namespaces", "process"))
    )
    hidden_paths: tuple[str, ...] = attrs.field(
        factory=_hidden_defaults, converter=tuple, validator=_absolute_paths
    )
    scratch_dir: str = attrs.field(default="/tmp/sandbox", validator=_scratch_in_hidden)
    uid_range: tuple[int, int] = attrs.field(default=(1_000_000_000, 1_100_000_000), validator=_uid_range)
    unshare_path: str | None = attrs.field(factory=lambda: shutil.which("unshare"))
    memory_cgroup: MemoryCgroup = attrs.field(
        default="auto", validator=attrs.validators.in_(("auto", "required", "off"))
    )

    def limits(self) -> dict[str, int]:
        """The rlimits applied to the model's process, keyed by lower-case RLIMIT name."""
        return {
            "cpu": self.cpu_s,
            "as": self.memory_bytes,
            "fsize": self.file_size_bytes,
            "nofile": self.open_files,
            "nproc": self.processes,
        }

    def describe_limits(self) -> str:
        """One line naming the limits, shown in tool errors so the model knows what it hit."""
        network = "no network" if self.isolation == "namespaces" else "network not isolated"
        return (
            f"limits: wall {self.deadline_s:g} s, cpu {self.cpu_s} s, memory {self.memory_bytes // _MIB} MiB, "
            f"processes {self.processes}, file size {self.file_size_bytes // _MIB} MiB, "
            f"open files {self.open_files}, {network}"
        )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, /, **overrides: object) -> SandboxConfig:
        """Build a config from ``MCPRL_SANDBOX_*`` variables (e.g. ``MCPRL_SANDBOX_DEADLINE_S=5``).

        Args:
            environ: Variables to read (default: ``os.environ``).
            **overrides: Field values that win over the environment.

        Raises:
            ValueError: A ``MCPRL_SANDBOX_*`` variable names no field, or a value is invalid.
        """
        env = os.environ if environ is None else environ
        fields = {f.name: f for f in attrs.fields(cls)}
        values: dict[str, object] = {}
        for key, raw in env.items():
            if not key.startswith(ENV_PREFIX):
                continue
            name = key[len(ENV_PREFIX) :].lower()
            if name not in fields:
                valid = ", ".join(ENV_PREFIX + n.upper() for n in fields)
                raise ValueError(f"unknown sandbox setting {key}; valid: {valid}")
            values[name] = _parse(name, raw)
        values.update(overrides)
        return cls(**values)  # pyright: ignore[reportArgumentType]


def _parse(name: str, raw: str) -> object:
    match name:
        case "deadline_s":
            return float(raw)
        case "isolation" | "scratch_dir" | "unshare_path" | "memory_cgroup":
            return raw
        case "hidden_paths":
            return tuple(p for p in raw.split(os.pathsep) if p)
        case "uid_range":
            low, _, high = raw.partition("-")
            return (int(low), int(high))
        case _:
            return int(raw)
