"""examples/real-servers: the file loads as written, and doctor names each missing variable per server.

The real APIs need keys and the network, which the test suite has neither of: the servers are not started
(``--skip-servers``); what is checked is what a user sees first, with no variable set.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from mcprl_tools import ServersConfig
from mcprl_train.cli import main

SERVERS = Path(__file__).resolve().parents[1] / "examples" / "real-servers" / "servers.json"
VARIABLES = {
    "market": {"ALPHAVANTAGE_API_KEY"},
    "quotes": set(),
    "search": {"BRAVE_API_KEY"},
    "fetch": set(),
    "slack": {"SLACK_BOT_TOKEN", "SLACK_TEAM_ID"},
    "code": {"E2B_API_KEY"},
}


@pytest.fixture(autouse=True)
def _no_keys(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for names in VARIABLES.values():
        for name in names:
            monkeypatch.delenv(name, raising=False)
    yield
    structlog.reset_defaults()  # doctor configures structlog for its console


def test_the_example_loads_with_its_variables_and_state() -> None:
    config = ServersConfig.load(SERVERS, missing_variables="keep")
    assert {name: set(server.variables) for name, server in config.servers.items()} == VARIABLES
    assert [name for name, server in config.servers.items() if server.stateful] == ["slack"]
    with pytest.raises(ValueError, match="ALPHAVANTAGE_API_KEY"):
        ServersConfig.load(SERVERS)


def test_doctor_names_every_missing_variable_with_its_server(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["doctor", "--skip-servers", "--set", f"tools.servers={SERVERS}"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1
    for server, names in VARIABLES.items():
        for name in names:
            assert f"${{{name}}} (server {server})" in out
            assert f"export {name}=..." in out
