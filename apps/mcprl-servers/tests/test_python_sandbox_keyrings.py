"""A call killed at its deadline leaves no keyring of its throw-away uid behind (the server sweeps them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import anyio
import pytest

from mcprl_servers.sandbox import SandboxConfig, run_sandboxed

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="throw-away uids exist only when the server runs as root"
)

_ADD_KEYS_THEN_HANG = """
import ctypes, os, platform, time
nr = {"x86_64": 248, "aarch64": 217}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
added = [libc.syscall(nr, b"user", b"canary", b"secret", 6, ring) > 0 for ring in (-3, -4)]  # @s, @u
print(os.getuid(), *added, flush=True)
time.sleep(60)
"""


def _keys_of(uid: str) -> int:
    """The uid's key count in /proc/key-users (every key it owns, keyrings included; 0: no entry)."""
    for line in Path("/proc/key-users").read_text().splitlines():
        owner, count, *_ = line.split()
        if owner == f"{uid}:":
            return int(count)
    return 0


def _gone(uid: str) -> bool:
    deadline = time.monotonic() + 10
    while _keys_of(uid) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel frees an unreferenced keyring from a work queue: nothing to wait on
    return _keys_of(uid) == 0


def test_a_call_killed_at_its_deadline_leaves_no_keys_of_its_uid() -> None:
    outcome = anyio.run(run_sandboxed, _ADD_KEYS_THEN_HANG, SandboxConfig(deadline_s=2.0))
    assert outcome.status == "timed_out", outcome
    uid, *added = outcome.stdout.decode().split()
    assert added == ["True", "True"]
    assert _gone(uid), f"uid {uid} still owns {_keys_of(uid)} keys after its call was killed"


def test_a_call_killed_for_its_output_leaves_no_keys_of_its_uid() -> None:
    code = _ADD_KEYS_THEN_HANG.replace("time.sleep(60)", "while True: print('x' * 4096)")
    outcome = anyio.run(run_sandboxed, code, SandboxConfig(deadline_s=20.0, output_cap_bytes=1 << 16))
    assert outcome.status == "output_capped", outcome
    uid, *added = outcome.stdout.decode().split("\n")[0].split()
    assert added == ["True", "True"]
    assert _gone(uid), f"uid {uid} still owns {_keys_of(uid)} keys after its call was killed"
