"""Errors of the task generators."""

from __future__ import annotations

__all__ = ["TasksError", "UnknownFamilyError", "UnknownPresetError"]


class TasksError(Exception):
    """Base class of every mcprl_tasks error."""


class UnknownFamilyError(TasksError, KeyError):
    """A task family name is not registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown family"


class UnknownPresetError(TasksError, KeyError):
    """A preset name is not shipped."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown preset"
