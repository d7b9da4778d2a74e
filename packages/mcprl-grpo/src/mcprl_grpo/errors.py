"""Errors raised by mcprl-grpo; every one derives from `GrpoError`.

Each subclass also inherits the builtin that fits, so callers that only know the builtin
(``except ValueError``) still catch it.
"""

from __future__ import annotations

from collections.abc import Sequence


class GrpoError(Exception):
    """Base class of every mcprl-grpo error."""


class ShapeError(GrpoError, ValueError):
    """A tensor's shape does not match what the function needs; the message names the tensor and both shapes."""

    def __init__(self, name: str, got: Sequence[int], expected: str) -> None:
        self.name = name
        self.got = tuple(int(d) for d in got)
        self.expected = expected
        super().__init__(f"{name} has shape {self.got}, expected {expected}")


class MaskError(GrpoError, ValueError):
    """A mask is not boolean (or 0/1) or does not line up with its tensor; the message names the mask."""


class DTypeError(GrpoError, TypeError):
    """A tensor has a dtype the function cannot use (e.g. float group ids); the message names the tensor."""


class ArgumentError(GrpoError, ValueError):
    """A scalar argument is out of range (negative epsilon, dual-clip bound <= 1, ...); names the argument."""
