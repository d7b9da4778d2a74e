"""Public surface: every name of `__all__` resolves, and the config side imports without torch."""

from __future__ import annotations

import subprocess
import sys

import pytest

import mcprl_policy
import mcprl_policy.policy


def test_every_public_name_resolves() -> None:
    assert set(mcprl_policy.__all__) <= set(dir(mcprl_policy))
    for name in mcprl_policy.__all__:
        assert hasattr(mcprl_policy, name), name


def test_a_lazy_name_is_its_modules_object() -> None:
    assert mcprl_policy.Policy is mcprl_policy.policy.Policy


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'Polcy'"):
        getattr(mcprl_policy, "Polcy")  # noqa: B009


def test_the_config_imports_without_torch_or_transformers() -> None:
    """An app's config names `SamplingParams` or `LoraSettings`; checked in a fresh interpreter."""
    probe = (
        "import sys\n"
        "from mcprl_policy import DType, LoraSettings, PolicyError, Quantization, SamplingParams\n"
        "from mcprl_policy.config import SamplingParams\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr
