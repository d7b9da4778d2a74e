"""Fixtures: the test kit on sys.path, the anyio backend, the test tokenizer, an in-memory manager."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from env_testkit import memory_manager
from real_templates import fetch_templates

from mcprl_env.testing import CharTokenizer
from mcprl_tools import ToolManager


@pytest.fixture(scope="session")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def chat_templates_dir() -> Path:
    """The vendors' chat templates (scripts/fetch-chat-templates.py; fetched once per machine, then cached)."""
    directory, why = fetch_templates()
    if directory is None:
        pytest.skip(f"real chat templates unavailable: {why}")
    return directory


@pytest.fixture
def tokenizer() -> CharTokenizer:
    return CharTokenizer()


@pytest.fixture
async def manager() -> AsyncIterator[ToolManager]:
    async with memory_manager(call_timeout=5) as m:
        yield m
