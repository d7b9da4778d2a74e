"""Public surface: sorted `__all__`, lazy imports, error hierarchy, and the README example runs as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import mcprl_grpo
import mcprl_grpo.advantages
import mcprl_grpo.choices
import mcprl_grpo.kl
from mcprl_grpo import ArgumentError, DTypeError, GrpoError, MaskError, ShapeError

README = Path(__file__).resolve().parents[1] / "README.md"


def test_all_is_sorted_and_every_name_resolves() -> None:
    assert mcprl_grpo.__all__ == sorted(mcprl_grpo.__all__)
    for name in mcprl_grpo.__all__:
        assert hasattr(mcprl_grpo, name), name


def test_dir_lists_every_public_name() -> None:
    assert set(mcprl_grpo.__all__) <= set(dir(mcprl_grpo))


def test_a_lazy_name_is_its_modules_object() -> None:
    assert mcprl_grpo.group_advantages is mcprl_grpo.advantages.group_advantages
    assert mcprl_grpo.token_kl is mcprl_grpo.kl.token_kl


def test_choices_are_one_object_on_every_import_path() -> None:
    assert mcprl_grpo.advantages.Estimator is mcprl_grpo.choices.Estimator is mcprl_grpo.Estimator
    assert mcprl_grpo.kl.KLEstimator is mcprl_grpo.choices.KLEstimator is mcprl_grpo.KLEstimator


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'group_advantage'"):
        getattr(mcprl_grpo, "group_advantage")  # noqa: B009


def test_the_package_its_choices_and_errors_import_without_torch() -> None:
    """A config that names a choice must not pay for torch; checked in a fresh interpreter."""
    probe = (
        "import sys, mcprl_grpo, mcprl_grpo.choices, mcprl_grpo.errors\n"
        "from mcprl_grpo import AggregationMode, Estimator, GrpoError, KLEstimator\n"
        "print('torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert (done.returncode, done.stdout.strip()) == (0, "False"), done.stderr


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
