"""Shared fixtures: the embedded tiny model, built once per session into a private cache; the test kit
(`decode_testkit.py`) on sys.path."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib adds no test directory

from mcprl_policy import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the embedded ``tiny`` model, built in a session-private cache."""
    return build_tiny_model("tiny", cache_dir=tmp_path_factory.mktemp("models"))
