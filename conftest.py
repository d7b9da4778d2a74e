"""Fixtures shared by every test folder of the workspace (pytest loads this file for all of them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

FETCH_SCRIPT = Path(__file__).resolve().parent / "scripts" / "fetch-chat-templates.py"


@pytest.fixture(scope="session")
def chat_templates_dir() -> Path:
    """The vendors' cached chat templates and the Qwen2 vocabulary (scripts/fetch-chat-templates.py fetches them
    once per machine); skips with the reason when they cannot be fetched."""
    if os.environ.get("MCPRL_NO_CHAT_TEMPLATES"):
        pytest.skip("real chat templates unavailable: MCPRL_NO_CHAT_TEMPLATES is set")
    if not FETCH_SCRIPT.is_file():
        pytest.skip(f"real chat templates unavailable: {FETCH_SCRIPT} is not there")
    try:
        done = subprocess.run(
            [sys.executable, str(FETCH_SCRIPT)], capture_output=True, text=True, timeout=900, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.skip("real chat templates unavailable: scripts/fetch-chat-templates.py took over 900 s")
    if done.returncode != 0:
        pytest.skip(f"real chat templates unavailable: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip())
