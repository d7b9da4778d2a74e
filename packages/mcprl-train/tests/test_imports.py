"""``import mcprl_train``, ``mcprl-train config``, ``--help`` and a one-line config error load no torch.

Each check runs in a fresh interpreter: the test process itself has long since imported torch.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

_HEAVY = ("torch", "transformers")


def _heavy_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter and return which of `_HEAVY` it left in ``sys.modules``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps([m for m in {_HEAVY!r} if m in sys.modules]))\n"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    return loaded


def test_importing_the_package_and_the_cli_loads_no_torch() -> None:
    assert _heavy_modules_after("import mcprl_train, mcprl_train.cli, mcprl_train.config") == []


@pytest.mark.parametrize(
    "code",
    [
        "assert main(['config']) == 0",
        "assert main(['config', '--profile', 'a100x2', '--set', 'run.steps=3']) == 0",
        "assert main(['config', '--set', 'grpo.estimator=nope']) == 2",
        "try:\n    main(['--help'])\nexcept SystemExit as exit:\n    assert exit.code == 0",
    ],
    ids=["config", "config-profile", "config-error", "help"],
)
def test_config_and_help_load_no_torch(code: str) -> None:
    assert _heavy_modules_after(f"from mcprl_train.cli import main\n{code}") == []
