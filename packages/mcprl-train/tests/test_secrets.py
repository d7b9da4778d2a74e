"""A secret written literally in an inline server's ``env`` reaches its server and nothing mcprl writes or prints.

The real CLI trains the tiny model one step against the bundled finance server (a stdio subprocess), with
wandb in offline mode writing its files into the run directory; then every file of the run, the console and
the log are searched for the secret. Resuming asks for the secret again instead of starting the server
with ``***``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import pytest
import structlog
import yaml

from mcprl_servers.config import default_servers_config
from mcprl_tools.config import REDACTED
from mcprl_train.cli import main

pytestmark = pytest.mark.slow

CANARY = "literal-canary-5e1d7b"


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """`train` configures structlog to write to the test's captured stderr and the run's log file."""
    yield
    from mcprl_train.run.tracking import configure_logging

    configure_logging(json_output=True)  # closes the run's log file
    structlog.reset_defaults()


def _files_holding(root: Path, needle: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and needle.encode() in p.read_bytes()]


def test_a_literal_env_secret_is_in_no_file_log_or_console_and_resume_asks_for_it(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    finance = cast(dict[str, dict[str, object]], default_servers_config(["finance"])["mcpServers"])["finance"]
    server = {**finance, "env": {"API_KEY": CANARY, "LOG_LEVEL": "1"}}
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"tools": {"mcp_servers": {"finance": server}}}))
    runs = tmp_path / "runs"
    common = [
        "--set", "sft.enabled=false",
        "--set", "grpo.group_size=2",
        "--set", "grpo.tasks_per_step=2",
        "--set", "env.max_new_tokens_per_turn=8",
        "--set", "env.max_turns_by_difficulty={easy: 1, medium: 1, hard: 1}",
        "--set", "eval.every=0",
        "--set", "eval.n_tasks=2",
        "--set", "tracking.wandb=offline",
        "--set", "tracking.progress=false",
    ]  # fmt: skip
    args = ["train", "--config", str(config), "--run-name", "r", "--set", f"run.output_dir={runs}"]
    assert main([*args, "--set", "run.steps=1", "--set", "tasks.train=preset:demo", *common]) == 0

    run = runs / "r"
    assert (run / "wandb").is_dir(), "wandb wrote nothing: the test would not check its files"
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["tools"]["mcp_servers"]["finance"]["env"] == {"API_KEY": "***", "LOG_LEVEL": "1"}
    assert _files_holding(run, CANARY) == []
    out, err = capfd.readouterr()
    assert CANARY not in out + err

    assert main(["train", "--resume", str(run), "--set", "run.steps=2"]) == 2
    err = capfd.readouterr().err
    [line] = [line for line in err.splitlines() if line.startswith("error:")]
    assert "tools.mcp_servers.finance.env.API_KEY" in line
    assert "--set" in line

    given = f"tools.mcp_servers.finance.env.API_KEY={CANARY}"
    assert main(["train", "--resume", str(run), "--set", "run.steps=2", "--set", given]) == 0
    assert _files_holding(run, CANARY) == []
    out, err = capfd.readouterr()
    assert CANARY not in out + err


def test_a_secret_given_on_the_command_line_is_not_in_wandbs_metadata(tmp_path: Path) -> None:
    """wandb stores the process's command line: run the CLI as a process, the secret given with ``--set``.

    The in-process test above cannot see this: there ``sys.argv`` is pytest's.
    """
    finance = cast(dict[str, dict[str, object]], default_servers_config(["finance"])["mcpServers"])["finance"]
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump({"tools": {"mcp_servers": {"finance": {**finance, "env": {"API_KEY": "x"}}}}})
    )
    runs = tmp_path / "runs"
    env = {**os.environ, "WANDB_SILENT": "true"}
    env.pop("WANDB_MODE", None)
    args = [
        sys.executable, "-m", "mcprl_train", "train", "--config", str(config), "--run-name", "r",
        "--set", f"run.output_dir={runs}",
        "--set", f"tools.mcp_servers.finance.env.API_KEY={CANARY}",
        "--set", "run.steps=0", "--set", "sft.enabled=false", "--set", "eval.every=0",
        "--set", "eval.n_tasks=1", "--set", "env.max_new_tokens_per_turn=8",
        "--set", "env.max_turns_by_difficulty={easy: 1, medium: 1, hard: 1}",
        "--set", "tracking.wandb=offline", "--set", "tracking.progress=false",
    ]  # fmt: skip
    # run.steps=0 still evaluates before and after: one short task is enough for wandb to record the process.
    done = subprocess.run(args, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    # Offline, the command line is a record of the run's .wandb file (online: wandb-metadata.json's "args").
    recorded = f"tools.mcp_servers.finance.env.API_KEY={REDACTED}"
    assert _files_holding(runs / "r" / "wandb", recorded), "wandb did not record the command line"
    assert _files_holding(runs / "r", CANARY) == []
    assert CANARY not in done.stdout + done.stderr
