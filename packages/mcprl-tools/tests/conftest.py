"""Fixtures: the test kit on sys.path, the anyio backend, a shared real stdio server."""

from __future__ import annotations

import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from tools_testkit import flaky_server, marked_processes

from mcprl_tools import ServersConfig, ToolManager


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def marker() -> str:
    return uuid.uuid4().hex


@pytest.fixture(scope="module")
async def stdio_manager() -> AsyncIterator[tuple[ToolManager, str]]:
    """One real stdio server shared by the tests that are not about its lifecycle."""
    mark = uuid.uuid4().hex
    cfg = ServersConfig.from_dict(
        {"mcpServers": {"flaky": flaky_server(mark, call_timeout=10, max_concurrency=8)}}, source="<test>"
    )
    async with ToolManager(cfg) as manager:
        yield manager, mark
    assert marked_processes(mark) == []
