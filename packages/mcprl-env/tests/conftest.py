"""Fixtures: the test kit on sys.path, the anyio backend, the test tokenizer, an in-memory manager."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from env_testkit import memory_manager

from mcprl_env.testing import CharTokenizer
from mcprl_tools import ToolManager


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
async def manager() -> AsyncIterator[ToolManager]:
    async with memory_manager(call_timeout=5) as m:
        yield m
