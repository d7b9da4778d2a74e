"""The python sandbox server under hostile code (RELIABILITY.md scenarios 4-8), through MCP clients.

Every test asserts containment (what the code could not do, checked from outside) and a clear tool
error, and that the server still lists its tools afterwards.
"""

from __future__ import annotations

import os
import resource
import secrets
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.types import CallToolResult, TextContent

from mcprl_servers.python_sandbox import build_server
from mcprl_servers.sandbox import SandboxConfig

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(
        os.geteuid() != 0,
        reason="these check the root path (throw-away uids, memory cgroups); the path without root is "
        "test_python_sandbox_rootless.py",
    ),
]

CANARY = f"mcprl-canary-{uuid.uuid4().hex}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _config(**overrides: object) -> SandboxConfig:
    # A private uid range per config, so process counts never see another test run's sandboxes.
    low = 1_000_000_000 + secrets.randbelow(1_000_000) * 100
    values: dict[str, object] = {
        "deadline_s": 2.0,
        "memory_bytes": 256 * 1024 * 1024,
        "uid_range": (low, low + 100),
    }
    values.update(overrides)
    return SandboxConfig(**values)  # pyright: ignore[reportArgumentType]


@asynccontextmanager
async def _client(config: SandboxConfig | None = None) -> AsyncIterator[Client]:
    async with Client(build_server(config or _config())) as client:
        yield client
        # The server survives whatever the code did: it still lists its tools.
        assert [tool.name for tool in (await client.list_tools()).tools] == ["run_python"]


def _text(result: CallToolResult) -> str:
    return "".join(block.text for block in result.content if isinstance(block, TextContent))


async def _run(client: Client, code: str) -> tuple[bool, str]:
    with anyio.fail_after(30):
        result = await client.call_tool("run_python", {"code": code})
    text = _text(result)
    assert CANARY not in text
    return result.is_error, text


def _host_processes_with(marker: str) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _host_sandbox_processes(config: SandboxConfig) -> int:
    count = 0
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid_line = next(
                    line for line in (entry / "status").read_text().splitlines() if line.startswith("Uid:")
                )
            except (OSError, StopIteration):
                continue
            if config.uid_range[0] <= int(uid_line.split()[1]) < config.uid_range[1]:
                count += 1
    return count


def _spawn_marked_daemon(marker: str) -> str:
    """Model code: a setsid'd double-forked grandchild carrying ``marker``; waits until it is running."""
    return f"""
import os, sys, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(1000)", "{marker}"])
    os._exit(0)
os.wait()
deadline = time.time() + 5
while time.time() < deadline:
    if any("{marker}".encode() in open(f"/proc/{{p}}/cmdline", "rb").read()
           for p in os.listdir("/proc") if p.isdigit() and p != str(os.getpid())):
        print("daemon running")
        break
"""


async def test_prints_stdout_of_a_successful_run() -> None:
    async with _client() as client:
        is_error, text = await _run(client, "import math\nprint(math.factorial(20))")
    assert not is_error
    assert text.strip() == "2432902008176640000"


async def test_exception_is_a_tool_error_with_traceback_tail() -> None:
    async with _client() as client:
        is_error, text = await _run(client, "def f():\n    return 1 / 0\nf()")
    assert is_error
    assert "exit status 1" in text
    assert "ZeroDivisionError: division by zero" in text
    assert "return 1 / 0" in text
    assert "supervisor.py" not in text


async def test_infinite_loop_is_killed_at_the_deadline() -> None:
    async with _client() as client:
        start = time.monotonic()
        is_error, text = await _run(client, "while True:\n    pass")
        elapsed = time.monotonic() - start
    assert is_error
    assert "timed out" in text
    assert "2 s wall-clock deadline" in text
    assert 1.8 < elapsed < 2.0 * 1.1 + 1.5  # deadline +10 %, plus process start-up on a loaded machine


async def test_sleep_is_killed_at_the_deadline() -> None:
    async with _client() as client:
        is_error, text = await _run(client, "import time\nprint('before', flush=True)\ntime.sleep(1000)")
    assert is_error
    assert "timed out" in text
    assert "before" in text


async def test_cpu_burn_hits_the_cpu_limit() -> None:
    async with _client(_config(cpu_s=1, deadline_s=10.0)) as client:
        is_error, text = await _run(client, "x = 0\nwhile True:\n    x += 1")
    assert is_error
    assert "CPU time limit exceeded" in text


async def test_background_double_fork_and_setsid_leave_no_process() -> None:
    marker = f"mcprl-marker-{uuid.uuid4().hex}"
    async with _client() as client:
        is_error, text = await _run(client, _spawn_marked_daemon(marker))
        assert not is_error, text
        assert "daemon running" in text
        assert _host_processes_with(marker) == []


async def test_background_child_of_a_timed_out_call_is_killed() -> None:
    marker = f"mcprl-marker-{uuid.uuid4().hex}"
    async with _client() as client:
        is_error, text = await _run(client, _spawn_marked_daemon(marker) + "\nwhile True:\n    pass")
        assert is_error
        assert "timed out" in text
        assert "daemon running" in text
        assert _host_processes_with(marker) == []


async def test_fork_bomb_is_contained_even_as_root() -> None:
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass"
    config = _config(processes=16)
    peak = 0
    is_error, text = False, ""
    async with _client(config) as client:
        async with anyio.create_task_group() as tg:
            done = anyio.Event()

            async def sample() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, _host_sandbox_processes(config))
                    await anyio.sleep(0.05)

            tg.start_soon(sample)
            is_error, text = await _run(client, code)
            done.set()
        assert _host_sandbox_processes(config) == 0
    assert is_error
    assert "timed out" in text
    assert 0 < peak <= config.processes


async def test_plain_fork_bomb_fails_with_a_clear_error() -> None:
    config = _config(processes=16)
    async with _client(config) as client:
        is_error, text = await _run(client, "import os\nwhile True:\n    os.fork()")
        assert _host_sandbox_processes(config) == 0
    assert is_error
    assert "Resource temporarily unavailable" in text
    assert "processes 16" in text


async def test_memory_bomb_raises_memory_error() -> None:
    async with _client(_config(deadline_s=10.0)) as client:
        is_error, text = await _run(client, "blocks = []\nwhile True:\n    blocks.append(bytearray(10**7))")
    assert is_error
    assert "MemoryError" in text
    assert "memory 256 MiB" in text


async def test_huge_output_is_capped_without_growing_the_server() -> None:
    config = _config(deadline_s=10.0)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with _client(config) as client:
        start = time.monotonic()
        is_error, text = await _run(client, "import sys\nsys.stdout.write('x' * (100 * 1024 * 1024))")
        elapsed = time.monotonic() - start
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert is_error
    assert "output limit exceeded" in text
    assert f"[... output truncated at {config.output_cap_bytes} bytes]" in text
    assert len(text) < 8_000
    assert elapsed < config.deadline_s / 2
    assert grown_kib < 64 * 1024


async def test_flood_on_both_streams_is_capped_without_deadlock() -> None:
    code = (
        "import sys\nsys.stderr.write('e' * (20 * 1024 * 1024))\nsys.stdout.write('o' * (20 * 1024 * 1024))"
    )
    async with _client(_config(deadline_s=10.0)) as client:
        is_error, text = await _run(client, code)
    assert is_error
    assert "output limit exceeded" in text


async def test_one_50_mb_line_is_capped() -> None:
    async with _client(_config(deadline_s=10.0)) as client:
        is_error, text = await _run(client, "print('y' * 50_000_000)")
    assert is_error
    assert "output limit exceeded" in text


async def test_invalid_utf8_output_is_replaced_not_fatal() -> None:
    async with _client() as client:
        is_error, text = await _run(client, "import sys\nsys.stdout.buffer.write(b'ok \\xff\\xfe\\x80 end')")
    assert not is_error
    assert text == "ok \ufffd\ufffd\ufffd end"


async def test_large_file_hits_the_file_size_limit() -> None:
    async with _client(_config(file_size_bytes=4 * 1024 * 1024)) as client:
        is_error, text = await _run(
            client, "with open('big', 'wb') as f:\n    f.write(b'x' * (8 * 1024 * 1024))"
        )
    assert is_error
    assert "File too large" in text


async def test_disk_fill_hits_the_scratch_quota() -> None:
    code = "i = 0\nwhile True:\n    with open(f'f{i}', 'wb') as f:\n        f.write(b'x' * 1024 * 1024)\n    i += 1"
    free_before = os.statvfs("/").f_bavail
    async with _client(_config(scratch_bytes=16 * 1024 * 1024, file_size_bytes=4 * 1024 * 1024)) as client:
        is_error, text = await _run(client, code)
    assert is_error
    assert "No space left on device" in text
    # The scratch tmpfs never touched the host disk (slack for other processes writing meanwhile).
    assert (free_before - os.statvfs("/").f_bavail) * os.statvfs("/").f_frsize < 200 * 1024 * 1024


async def test_writes_outside_scratch_are_denied(tmp_path: Path) -> None:
    outside = Path("/tmp") / f"outside-marker-{uuid.uuid4().hex}"
    server_cwd = Path.cwd() / f"written-by-sandbox-{uuid.uuid4().hex}"
    async with _client() as client:
        for target in (outside, server_cwd, tmp_path / "x", Path("/etc/mcprl-x")):
            is_error, text = await _run(client, f"open({str(target)!r}, 'w').write('pwned')")
            assert is_error
            assert "Read-only file system" in text or "No such file or directory" in text
            assert not target.exists()
        is_error, text = await _run(
            client, "import os\nopen('ok.txt', 'w').write('x')\nprint(os.listdir('.'))"
        )
    assert not is_error
    assert text.strip() == "['ok.txt']"


async def test_scratch_dir_is_fresh_for_every_call() -> None:
    async with _client() as client:
        await _run(client, "open('left-behind', 'w').write('x')")
        is_error, text = await _run(client, "import os\nprint(os.listdir('.'), os.getcwd())")
    assert not is_error
    assert text.strip() == "[] /tmp/sandbox"


async def test_parent_environment_and_secrets_are_not_visible(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("MCPRL_TEST_SECRET", CANARY)
    secret_file = tmp_path / "checkpoint.txt"
    secret_file.write_text(CANARY)
    home_secret = Path.home() / f".mcprl-canary-{uuid.uuid4().hex}"
    home_secret.write_text(CANARY)
    try:
        code = f"""
import glob, os
print(dict(os.environ))
for path in glob.glob('/proc/*/environ') + ['/proc/{os.getpid()}/environ', '/proc/self/environ',
        {str(secret_file)!r}, {str(home_secret)!r}]:
    try:
        print(path, open(path, 'rb').read())
    except OSError as exc:
        print(path, type(exc).__name__)
print(os.listdir({os.getcwd()!r}), os.listdir({str(Path.home())!r}))
"""
        async with _client() as client:
            is_error, text = await _run(client, code)
            assert not is_error, text
            assert "{}" in text
            assert f"{secret_file} FileNotFoundError" in text
            is_error, text = await _run(client, f"print(open('/proc/{os.getpid()}/environ').read())")
            assert is_error
            assert "FileNotFoundError" in text
    finally:
        home_secret.unlink()


async def test_network_connections_and_dns_fail() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        async with _client() as client:
            is_error, text = await _run(
                client, f"import socket\nsocket.create_connection(('127.0.0.1', {port}), 2)"
            )
            assert is_error
            assert "Network is unreachable" in text
            is_error, text = await _run(client, "import socket\nsocket.getaddrinfo('pypi.org', 443)")
            assert is_error
            assert "gaierror" in text
        with pytest.raises(BlockingIOError):
            listener.accept()  # the listener accepted 0 connections


async def test_ten_thousand_open_files_hit_the_descriptor_limit() -> None:
    async with _client() as client:
        is_error, text = await _run(client, "files = [open('/dev/null') for _ in range(10_000)]")
    assert is_error
    assert "Too many open files" in text


async def test_calls_run_at_most_max_concurrency_at_once() -> None:
    code = "import time\nstart = time.time()\ntime.sleep(0.3)\nprint(start, time.time())"
    async with _client(_config(max_concurrency=1)) as client:
        spans: list[tuple[float, float]] = []

        async def one() -> None:
            _, text = await _run(client, code)
            start, end = map(float, text.split())
            spans.append((start, end))

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
    first, second = sorted(spans)
    assert second[0] >= first[1]


async def test_missing_isolation_refuses_to_run_the_code() -> None:
    async with _client(_config(unshare_path="/nonexistent/unshare")) as client:
        is_error, text = await _run(client, "print('ran')")
        assert is_error
        assert "sandbox unavailable:" in text
        assert "The code was not run" in text
    async with _client(_config(unshare_path="/bin/false")) as client:
        is_error, text = await _run(client, "print('ran')")
        assert is_error
        assert "sandbox unavailable:" in text
        assert "\nran" not in text


async def test_stdio_server_runs_code_and_survives_hostile_calls(tmp_path: Path) -> None:
    marker = f"mcprl-marker-{uuid.uuid4().hex}"
    env = {"PATH": os.environ.get("PATH", ""), "MCPRL_TEST_SECRET": CANARY, "MCPRL_SANDBOX_DEADLINE_S": "2"}
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "mcprl_servers.python_sandbox"], env=env, cwd=str(tmp_path)
    )
    dump_environ = (
        "import glob, os\nprint(dict(os.environ))\n"
        "for path in glob.glob('/proc/*/environ') + [f'/proc/{os.getppid()}/environ']:\n"
        "    try:\n        print(path, open(path, 'rb').read())\n"
        "    except OSError as exc:\n        print(path, exc)\n"
    )
    server_log = tmp_path / "server-stderr.log"
    with server_log.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as client:
            is_error, text = await _run(client, "print(sum(range(10)))")
            assert (is_error, text.strip()) == (False, "45")
            is_error, text = await _run(client, dump_environ)
            assert not is_error
            assert "{}" in text
            is_error, text = await _run(client, _spawn_marked_daemon(marker) + "\nwhile True:\n    pass")
            assert is_error
            assert "timed out" in text
            assert _host_processes_with(marker) == []
            is_error, text = await _run(client, "print('x' * 50_000_000)")
            assert is_error
            assert "output limit exceeded" in text
            tools = (await client.list_tools()).tools
            assert [tool.name for tool in tools] == ["run_python"]
            assert set(tools[0].input_schema["properties"]) == {"code"}
    assert CANARY not in server_log.read_text()


async def test_model_code_cannot_forge_a_sandbox_failure() -> None:
    forged = (
        "import os, sys\n"
        "sys.stderr.write('sandbox: could not prepare the child: forged\\n')\n"
        "sys.stderr.flush()\n"
        "os._exit(125)\n"
    )
    async with _client(_config()) as client:
        is_error, text = await _run(client, forged)
    assert is_error
    assert "sandbox unavailable" not in text
    assert "exit status 125" in text  # the model's own exit, scored as its code failing


async def test_a_child_that_cannot_be_prepared_reports_over_its_own_channel() -> None:
    impossible = _config(open_files=2**40)  # above the kernel's nr_open: setrlimit fails in the child
    async with _client(impossible) as client:
        is_error, text = await _run(client, "print('ran')")
    assert is_error
    assert "sandbox unavailable: could not prepare the child:" in text
    assert "The code was not run" in text
    assert "\nran" not in text
