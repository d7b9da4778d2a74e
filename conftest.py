"""The test environment and fixtures shared by every test folder of the workspace (pytest loads this file for
all of them, before any test module is imported).

The suite owns its environment: whatever the caller exported, tests run with tracking off, the hub offline and
the tokenizers' thread pool off, and without a wandb service or API key of the caller's. A test that is about
one of these variables sets it itself (``monkeypatch.setenv``, or the ``env=`` of the process it starts).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TEST_ENVIRONMENT = {
    "WANDB_MODE": "disabled",
    "WEAVE_DISABLED": "true",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}
"""Set for the whole session before anything imports huggingface_hub (which reads ``HF_HUB_OFFLINE`` once)."""
CALLERS_ONLY = ("WANDB_SERVICE", "WANDB_API_KEY", "WANDB_DIR", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
"""Dropped: a caller's wandb service, account or token must not reach the tests' runs."""

os.environ.update(TEST_ENVIRONMENT)
for _name in CALLERS_ONLY:
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _no_wandb_service_after_the_test() -> Iterator[None]:
    """A test that starts wandb in this process leaves its service's address in ``WANDB_SERVICE``: every process
    a later test starts would share that service (and a killed run's stream would stay open there)."""
    yield
    os.environ.pop("WANDB_SERVICE", None)


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
