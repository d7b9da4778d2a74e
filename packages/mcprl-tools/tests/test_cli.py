"""The `mcprl-tools` CLI against a real stdio server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from tools_testkit import flaky_server

from mcprl_tools.cli import main


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.reset_defaults()


@pytest.fixture
def config_file(tmp_path: Path, marker: str) -> Path:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"flaky": flaky_server(marker)}}))
    return path


def test_call_prints_the_result_as_json(config_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["call", "--config", str(config_file), "flaky.add", '{"a": 1, "b": 41}'])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["kind"] == "ok"
    assert out["text"] == "42"


def test_bad_config_exits_2_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"x": {"comand": "p"}}}))
    assert main(["list", "--config", str(path)]) == 2
    assert 'did you mean "command"' in capsys.readouterr().err
