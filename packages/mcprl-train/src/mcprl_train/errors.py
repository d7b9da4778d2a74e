"""Errors raised by mcprl-train; every one derives from `TrainError`."""

from __future__ import annotations


class TrainError(Exception):
    """Base class of every mcprl-train error."""


class RatioHealthError(TrainError, RuntimeError):
    """Importance ratios stayed exactly 1 after an optimizer step: the update reached no parameter."""


class InvalidRateError(TrainError, RuntimeError):
    """Too many episodes failed for reasons other than the model (infrastructure, user code): the run aborts with the reason."""


class ConfigError(TrainError, ValueError):
    """A config key is unknown or a value is invalid; the message names the key and what was expected."""


class RunDirError(TrainError, RuntimeError):
    """A run directory cannot be created or opened (exists already, not a run, malformed record)."""


class CheckpointError(TrainError, RuntimeError):
    """No complete, verified checkpoint could be loaded (every candidate failed its checksums)."""


class ExportError(TrainError, ValueError):
    """A checkpoint cannot be exported or pushed (missing/corrupt input, an occupied output, no hub token)."""


class PlanError(TrainError, ValueError):
    """The memory plan cannot be made (model config unreadable, unknown LoRA target)."""


class TrackingError(TrainError, RuntimeError):
    """Experiment tracking was requested but cannot start (missing extra, weave without an API key)."""


class DistributedError(TrainError, RuntimeError):
    """Multi-process training cannot start (DeepSpeed missing, no launcher environment)."""


class DemonstrationError(TrainError, ValueError):
    """A warm-start demonstration cannot be rendered into targets; the message names it and the problem."""
