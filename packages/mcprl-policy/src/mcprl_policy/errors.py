"""Errors raised by mcprl-policy: one base class, subclasses also inherit the builtin that fits."""

from __future__ import annotations

__all__ = [
    "MissingExtraError",
    "ModelLoadError",
    "PolicyError",
    "SamplerError",
    "UnpackableModelError",
]


class PolicyError(Exception):
    """Base class of every error raised by mcprl-policy."""


class ModelLoadError(PolicyError, OSError):
    """A model or tokenizer could not be found, downloaded or built."""


class MissingExtraError(PolicyError, ImportError):
    """An optional backend (bitsandbytes, vllm) is not installed; the message names the install command."""


class SamplerError(PolicyError, RuntimeError):
    """A generation request could not be served (bad prompt, sampler closed, backend failure)."""


class UnpackableModelError(PolicyError, ValueError):
    """The model cannot run several sequences packed in one row (recurrent state would leak across them)."""
