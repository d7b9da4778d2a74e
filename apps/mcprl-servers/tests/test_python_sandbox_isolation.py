"""Sandbox isolation levels, configuration, and the backstop when the server itself dies."""

from __future__ import annotations

import os
import signal
import sys
import uuid
from pathlib import Path

import anyio
import pytest
from mcp import Client
from mcp.types import TextContent

from mcprl_servers.python_sandbox import build_server, format_outcome
from mcprl_servers.sandbox import SandboxConfig, run_sandboxed

pytestmark = pytest.mark.anyio
_IS_ROOT = os.geteuid() == 0
_needs_root = pytest.mark.skipif(not _IS_ROOT, reason="namespaces isolation needs root")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _marked(marker: str) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _daemon_code(marker: str) -> str:
    return f"""
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sh", ["/bin/sh", "-c", "sleep 1000; true", "{marker}"])
    os._exit(0)
os.wait()
print("spawned", flush=True)
"""


async def _wait_exit(pid: int) -> None:
    """Wait (event-driven, via a pidfd) until ``pid`` has exited."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


@_needs_root
async def test_namespaces_child_sees_only_standard_descriptors() -> None:
    config = SandboxConfig(deadline_s=5.0)
    outcome = await run_sandboxed("import os\nprint(sorted(os.listdir('/proc/self/fd')))", config)
    # 0, 1, 2 and the descriptor listdir itself opened: no status pipe, no server descriptors.
    assert format_outcome(outcome, config).strip() == "['0', '1', '2', '3']"


@_needs_root
async def test_namespaces_child_runs_unprivileged_and_cannot_regain_root() -> None:
    config = SandboxConfig(deadline_s=5.0)
    code = "import os\nprint(os.getuid(), os.getgid(), os.getgroups())\nos.setuid(0)"
    outcome = await run_sandboxed(code, config)
    assert outcome.status == "exited"
    assert outcome.exit_code == 1
    uid = int(outcome.stdout.split()[0])
    assert config.uid_range[0] <= uid < config.uid_range[1]
    assert b"PermissionError" in outcome.stderr


@_needs_root
async def test_memory_bomb_peak_rss_stays_under_the_limit() -> None:
    config = SandboxConfig(deadline_s=10.0, memory_bytes=128 * 1024 * 1024)
    outcome = await run_sandboxed("blocks = []\nwhile True:\n    blocks.append(bytearray(10**6))", config)
    assert outcome.status == "exited"
    assert b"MemoryError" in outcome.stderr
    assert outcome.peak_rss_kib is not None
    assert outcome.peak_rss_kib * 1024 <= config.memory_bytes


@pytest.mark.skipif(not _IS_ROOT, reason="the uid sweep of process isolation needs root")
async def test_process_isolation_runs_in_a_deleted_scratch_dir_and_kills_escapees() -> None:
    marker = f"mcprl-marker-{uuid.uuid4().hex}"
    config = SandboxConfig(deadline_s=5.0, isolation="process")
    code = _daemon_code(marker) + "import os\nprint(os.getcwd(), dict(os.environ))"
    outcome = await run_sandboxed(code, config)
    text = format_outcome(outcome, config)
    assert "spawned" in text
    scratch = text.split()[1]
    assert scratch.startswith("/tmp/mcprl-sandbox-")
    assert text.split(maxsplit=2)[2].strip() == "{}"
    assert not await anyio.Path(scratch).exists()
    assert _marked(marker) == []


async def test_process_isolation_says_network_is_not_isolated() -> None:
    assert "network not isolated" in SandboxConfig(isolation="process").describe_limits()
    assert "no network" in SandboxConfig().describe_limits()


@_needs_root
async def test_sandbox_dies_with_its_server_at_the_deadline_backstop() -> None:
    marker = f"mcprl-marker-{uuid.uuid4().hex}"
    code = _daemon_code(marker) + "import time\ntime.sleep(1000)"
    script = (
        "import anyio, sys\n"
        "from mcprl_servers.sandbox import SandboxConfig, run_sandboxed\n"
        "anyio.run(run_sandboxed, sys.stdin.read(), SandboxConfig(deadline_s=2.0))\n"
    )
    async with await anyio.open_process([sys.executable, "-c", script], stdout=None, stderr=None) as server:
        assert server.stdin is not None
        await server.stdin.send(code.encode())
        await server.stdin.aclose()
        with anyio.fail_after(15):
            while not (daemons := _marked(marker)):  # noqa: ASYNC110 - no event exists for "a process appeared"
                await anyio.sleep(0.05)
        server.send_signal(signal.SIGKILL)  # the server dies without cleaning up
        await server.wait()
    with anyio.fail_after(2.0 + 4.0):
        for pid in daemons:
            await _wait_exit(pid)
    assert _marked(marker) == []


def test_config_rejects_unknown_environment_settings() -> None:
    with pytest.raises(ValueError, match="MCPRL_SANDBOX_DEADLINE"):
        SandboxConfig.from_env({"MCPRL_SANDBOX_DEADLINE": "5"})


def test_config_reads_limits_from_the_environment() -> None:
    config = SandboxConfig.from_env({"MCPRL_SANDBOX_DEADLINE_S": "3.5", "MCPRL_SANDBOX_PROCESSES": "8"})
    assert config.deadline_s == 3.5
    assert config.limits()["nproc"] == 8


def test_config_rejects_a_scratch_dir_outside_hidden_paths() -> None:
    with pytest.raises(ValueError, match="scratch_dir"):
        SandboxConfig(scratch_dir="/var/lib/sandbox")


def test_config_rejects_non_positive_limits() -> None:
    with pytest.raises(ValueError, match="deadline_s"):
        SandboxConfig(deadline_s=0)


def test_config_never_hides_system_directories(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="system directory"):
        SandboxConfig(hidden_paths=("/tmp", "/usr"))
    monkeypatch.chdir("/")
    assert "/" not in SandboxConfig().hidden_paths


@_needs_root
async def test_nested_user_namespace_cannot_unhide_or_make_writable() -> None:
    config = SandboxConfig(deadline_s=5.0)
    home_file = Path.home() / f".mcprl-hidden-{uuid.uuid4().hex}"
    home_file.write_text("secret")
    try:
        script = f"mount -o remount,rw,bind /; echo remount=$?; umount -l {Path.home()}; echo umount=$?; ls -A {Path.home()}"
        code = f"import subprocess\nsubprocess.run(['unshare', '-Urm', 'sh', '-c', {script!r}])"
        outcome = await run_sandboxed(code, config)
    finally:
        home_file.unlink()
    assert outcome.status == "exited"
    if b"unshare failed" in outcome.stderr:
        pytest.skip("unprivileged user namespaces are disabled on this host")
    lines = outcome.stdout.decode().split()
    assert "remount=32" in lines
    assert "umount=32" in lines
    assert home_file.name not in lines


@_needs_root
async def test_multiprocessing_works_with_a_private_dev_shm() -> None:
    config = SandboxConfig(deadline_s=10.0)
    name = f"mcprl-shm-{uuid.uuid4().hex}"
    code = (
        "from concurrent.futures import ProcessPoolExecutor\n"
        "with ProcessPoolExecutor(2) as pool:\n"
        "    print(sum(pool.map(abs, [-1, -2, -3])))\n"
        f"open('/dev/shm/{name}', 'w').write('x')\n"
    )
    outcome = await run_sandboxed(code, config)
    assert format_outcome(outcome, config).strip() == "6"
    assert not await anyio.Path("/dev/shm", name).exists()


async def test_long_successful_output_is_truncated_with_a_marker() -> None:
    config = SandboxConfig(deadline_s=5.0, result_chars=1000)
    outcome = await run_sandboxed("print('z' * 5000)", config)
    if outcome.status == "setup_failed":
        pytest.skip("namespaces isolation is unavailable here")
    text = format_outcome(outcome, config)
    assert text.startswith("z" * 1000)
    assert text.endswith("[... truncated: 4001 more characters]")


async def test_oversized_code_is_rejected_before_running() -> None:
    config = SandboxConfig(max_code_bytes=100)
    async with Client(build_server(config)) as client:
        result = await client.call_tool("run_python", {"code": "print(1)\n" * 50})
    assert result.is_error
    assert "code too large" in "".join(b.text for b in result.content if isinstance(b, TextContent))
