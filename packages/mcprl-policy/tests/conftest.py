"""Shared fixtures: the embedded tiny model, built once per session into a private cache; the built-in pretrained
SmolLM2-135M-Instruct, fetched and converted once per machine into the model cache (skipped, with the reason,
where it cannot be fetched); the test kit (`decode_testkit.py`) on sys.path."""

from __future__ import annotations

import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # --import-mode=importlib adds no test directory

from mcprl_policy import ModelLoadError, build_tiny_model
from mcprl_policy.pinned_models import fetch_pinned_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory of the embedded ``tiny`` model, built in a session-private cache."""
    return build_tiny_model("tiny", cache_dir=tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The converted directory of ``smollm2-135m`` in the machine's model cache (fetched on first use)."""
    if os.environ.get("MCPRL_NO_PRETRAINED"):
        pytest.skip("smollm2-135m unavailable: MCPRL_NO_PRETRAINED is set")
    try:
        return fetch_pinned_model("smollm2-135m")
    except ModelLoadError as exc:
        pytest.skip(f"smollm2-135m unavailable: {exc}")


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
