"""One call cannot take the host's memory: every way of holding memory is bounded, and it all comes back.

Each program below tries to hold twice the call's 64 MiB limit through one mechanism. ``RLIMIT_AS`` alone
stops only the first: memfd pages, SysV and POSIX shared memory and tmpfs files sit outside a process's
address space, and several processes each under the limit add up. The per-call memory cgroup
(`mcprl_servers.sandbox.cgroup`), the IPC namespace's ``kernel.shm*`` limits and the sized ``/dev/shm``
stop the others. Afterwards the server's own cgroup holds what it held before.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.python_sandbox import format_outcome
from mcprl_servers.sandbox import SandboxConfig, run_sandboxed
from mcprl_servers.sandbox import runner as sandbox_runner
from mcprl_servers.sandbox.cgroup import memory_hierarchy, sweep_stale

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(os.geteuid() != 0, reason="namespaces isolation and cgroups need root"),
]

_LIMIT = 64 << 20
_HIERARCHY = memory_hierarchy()
_needs_cgroup = pytest.mark.skipif(_HIERARCHY is None, reason="no writable memory cgroup hierarchy here")

_PROGRAMS = {
    "heap": "b = bytearray(128 << 20)\nprint('held')",
    "processes": (
        "import os, time\n"
        "kids = []\n"
        "for _ in range(4):\n"
        "    pid = os.fork()\n"
        "    if pid == 0:\n"
        "        b = bytearray(40 << 20)\n"
        "        for i in range(0, len(b), 4096): b[i] = 1\n"
        "        time.sleep(3)\n"
        "        os._exit(0)\n"
        "    kids.append(pid)\n"
        "codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]\n"
        "assert codes == [0, 0, 0, 0], codes\n"
        "print('held')"
    ),
    "memfd": (
        "import os\n"
        "fds = [os.memfd_create('m') for _ in range(9)]\n"
        "for fd in fds:\n"
        "    for _ in range(15): os.write(fd, b'x' * (1 << 20))\n"
        "print('held')"
    ),
    "sysv_shm": (
        "import ctypes\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "libc.shmat.restype = ctypes.c_void_p\n"
        "ids = [libc.shmget(0, 16 << 20, 0o1000 | 0o600) for _ in range(8)]\n"
        "assert all(i >= 0 for i in ids), (ids, ctypes.get_errno())\n"
        "for i in ids:\n"
        "    addr = libc.shmat(i, None, 0)\n"
        "    ctypes.memset(addr, 1, 16 << 20)\n"
        "print('held')"
    ),
    "posix_shm": (
        "with open('/dev/shm/a', 'wb') as f:\n"
        "    for _ in range(128): f.write(b'x' * (1 << 20))\n"
        "print('held')"
    ),
    "tmpfs_files": (
        "for n in range(9):\n"
        "    with open(f'f{n}', 'wb') as f:\n"
        "        for _ in range(15): f.write(b'x' * (1 << 20))\n"
        "print('held')"
    ),
}


def _call_cgroups(directory: Path) -> set[Path]:
    return set(directory.glob("mcprl-sandbox-*"))


async def _usage_later(directory: Path, version: int) -> int:
    await anyio.sleep(0.1)
    return _usage(directory, version)


def _usage(directory: Path, version: int) -> int:
    return int((directory / ("memory.current" if version == 2 else "memory.usage_in_bytes")).read_text())


@pytest.fixture
def own_cgroup() -> Iterator[tuple[Path, int]]:
    """This test process in a memory cgroup of its own, under which the sandbox makes its call cgroups.

    The machine's cgroup also charges every other process on it (other tests, other runs on a shared machine),
    so its usage cannot show what one call left behind; this one's counts only this process and its calls.
    """
    assert _HIERARCHY is not None
    parent, version = _HIERARCHY
    mine = parent / f"mcprl-test-{os.getpid()}"
    mine.mkdir(exist_ok=True)
    (mine / "cgroup.procs").write_text(str(os.getpid()))
    sandbox_runner._hierarchy.cache_clear()  # pyright: ignore[reportPrivateUsage]
    try:
        yield mine, version
    finally:
        (parent / "cgroup.procs").write_text(str(os.getpid()))
        sandbox_runner._hierarchy.cache_clear()  # pyright: ignore[reportPrivateUsage]
        with contextlib.suppress(OSError):
            mine.rmdir()


@_needs_cgroup
@pytest.mark.parametrize("mechanism", list(_PROGRAMS))
async def test_holding_twice_the_limit_is_stopped_and_the_memory_comes_back(
    mechanism: str, own_cgroup: tuple[Path, int]
) -> None:
    directory, version = own_cgroup
    config = SandboxConfig(
        deadline_s=15.0, memory_bytes=_LIMIT, scratch_bytes=256 << 20, memory_cgroup="required"
    )
    before, cgroups = _usage(directory, version), _call_cgroups(directory)
    outcome = await run_sandboxed(_PROGRAMS[mechanism], config)
    assert outcome.status == "exited", outcome
    assert b"held" not in outcome.stdout
    with pytest.raises(ToolError):  # the model's fault, shown to it
        format_outcome(outcome, config)
    # The least of a few readings (this process's own allocations come and go), and a margin well below the
    # 128 MiB or more the program tried to hold.
    after = min([_usage(directory, version), *[await _usage_later(directory, version) for _ in range(4)]])
    assert after - before < 48 << 20, f"{(after - before) >> 20} MiB still held after the call"
    assert _call_cgroups(directory) <= cgroups  # this call's cgroup is gone


@_needs_cgroup
async def test_the_cgroup_is_what_stops_memory_outside_the_address_space() -> None:
    config = SandboxConfig(deadline_s=15.0, memory_bytes=_LIMIT, memory_cgroup="required")
    outcome = await run_sandboxed(_PROGRAMS["memfd"], config)
    assert outcome.oom_killed
    with pytest.raises(ToolError, match="out of memory: the call held more than 64 MiB in all"):
        format_outcome(outcome, config)


async def test_required_without_a_hierarchy_refuses_to_run_the_code(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stands in for a host without a writable memory cgroup hierarchy, which this machine has.
    monkeypatch.setattr(sandbox_runner, "_hierarchy", lambda: None)
    with pytest.raises(OSError, match="no writable memory cgroup hierarchy"):
        await run_sandboxed("print('ran')", SandboxConfig(memory_cgroup="required"))
    auto = await run_sandboxed("print('ran')", SandboxConfig(memory_cgroup="auto"))
    assert auto.stdout == b"ran\n"


@_needs_cgroup
def test_cgroups_of_a_dead_server_are_swept_and_a_live_ones_are_kept() -> None:
    assert _HIERARCHY is not None
    directory, _ = _HIERARCHY
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    left = directory / f"mcprl-sandbox-{dead}-000000000000"
    mine = directory / f"mcprl-sandbox-{os.getpid()}-000000000000"
    left.mkdir()
    mine.mkdir()
    try:
        assert sweep_stale(directory) >= 1
        assert not left.exists()
        assert mine.exists()
    finally:
        for path in (left, mine):
            if path.exists():
                path.rmdir()
