"""Public surface: sorted `__all__`, error hierarchy, and the README example runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import mcprl_grpo
from mcprl_grpo import ArgumentError, DTypeError, GrpoError, MaskError, ShapeError

README = Path(__file__).resolve().parents[1] / "README.md"


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert mcprl_grpo.__all__ == sorted(mcprl_grpo.__all__)
    for name in mcprl_grpo.__all__:
        assert hasattr(mcprl_grpo, name), name


def test_errors_share_a_base_and_the_fitting_builtin() -> None:
    assert issubclass(ShapeError, GrpoError)
    assert issubclass(ShapeError, ValueError)
    assert issubclass(MaskError, GrpoError)
    assert issubclass(MaskError, ValueError)
    assert issubclass(ArgumentError, GrpoError)
    assert issubclass(ArgumentError, ValueError)
    assert issubclass(DTypeError, GrpoError)
    assert issubclass(DTypeError, TypeError)
    err = ShapeError("advantages", (3, 4), "(3, 5)")
    assert str(err) == "advantages has shape (3, 4), expected (3, 5)"
    assert err.name == "advantages"
    assert err.got == (3, 4)


@pytest.mark.skipif(not README.is_file(), reason="README.md ships with the source tree, not the wheel")
def test_readme_example_runs() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)
    assert blocks, "README has a python example"
    exec(compile(blocks[0], str(README), "exec"), {})
