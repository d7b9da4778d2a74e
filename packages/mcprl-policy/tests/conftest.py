"""Shared fixtures: the embedded tiny model, built once per session into a private cache; the test kit
(`decode_testkit.py`) on sys.path."""

from __future__ import annotations

import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib adds no test directory

from mcprl_policy import build_tiny_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the embedded ``tiny`` model, built in a session-private cache."""
    return build_tiny_model("tiny", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture
def in_process_vllm_engine(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """vLLM engines in this process, collected when the test ends (the vLLM tests use it).

    Full-weight reload needs the engine core in this process. Afterwards the test's engines are collected at
    once: a vLLM engine collected later, while the next test's engine runs, tears down the process-wide parallel
    state that engine uses (see `Engine.close`).
    """
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    yield
    gc.collect()
