"""Secrets: `${VAR}` values reach only the server that names them; never in outputs, errors or logs."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs
from tools_testkit import flaky_server, make_server

from mcprl_tools import ServersConfig, ServerStartError, ToolManager
from mcprl_tools.config import is_literal_secret, redact_mapping

pytestmark = pytest.mark.anyio

CANARY = "canary-7f3a9c-secret"


async def test_secret_env_reaches_only_its_server(marker: str) -> None:
    with_secret = flaky_server(marker)
    with_secret["env"] = {**with_secret["env"], "API_KEY": "${MCPRL_CANARY}"}
    cfg = ServersConfig.from_dict(
        {"mcpServers": {"holder": with_secret, "other": flaky_server(marker)}},
        environ={"MCPRL_CANARY": CANARY},
    )
    with capture_logs() as logs:
        async with ToolManager(cfg) as manager:
            holder = await manager.call("holder.getenv", {"name": "API_KEY"})
            other = await manager.call("other.getenv", {"name": "API_KEY"})
            leaked_parent = await manager.call("other.getenv", {"name": "MCPRL_CANARY"})
    assert holder.ok
    assert holder.text == "***"  # the server got the secret; echoing it back to the model is redacted
    assert holder.structured == {"result": "***"}
    assert other.text == "<unset>"
    assert leaked_parent.text == "<unset>"
    assert CANARY not in repr(cfg)
    assert CANARY not in repr(logs)


async def test_start_errors_redact_the_secret() -> None:
    cfg = ServersConfig.from_dict(
        {
            "mcpServers": {
                "bad": {"command": "/nonexistent/bin", "args": ["--token=${TOKEN}"], "start_timeout": 5}
            }
        },
        environ={"TOKEN": CANARY},
    )
    with capture_logs() as logs, pytest.raises(ServerStartError) as err:
        async with ToolManager(cfg):
            pass
    assert CANARY not in str(err.value)
    assert CANARY not in repr(logs)


async def test_check_health_probes_every_server() -> None:
    async with ToolManager.in_memory({"a": make_server("a"), "b": make_server("b")}) as manager:
        assert await manager.check_health() == {"a": True, "b": True}
        assert manager.metrics()["tools/a/catalogue_changed"] == 0


async def test_a_literal_env_value_is_a_secret_too(marker: str) -> None:
    literal = flaky_server(marker)
    literal["env"] = {**literal["env"], "API_KEY": CANARY, "VERBOSE": "1"}
    cfg = ServersConfig.from_dict({"mcpServers": {"holder": literal}})
    assert CANARY in cfg.servers["holder"].secrets
    assert "1" not in cfg.servers["holder"].secrets  # a short flag is not blanked out of every output
    with capture_logs() as logs:
        async with ToolManager(cfg) as manager:
            key = await manager.call("holder.getenv", {"name": "API_KEY"})
            flag = await manager.call("holder.getenv", {"name": "VERBOSE"})
    assert key.text == "***"
    assert flag.text == "1"
    assert CANARY not in repr(cfg)
    assert CANARY not in repr(logs)


def test_literal_secrets_need_eight_characters_and_no_reference() -> None:
    assert is_literal_secret("sk-12345")
    assert not is_literal_secret("sk-1234")
    assert not is_literal_secret("Bearer ${TOKEN}")  # the expanded value is the secret, not the template
    assert redact_mapping({"A": "sk-12345", "B": "${B}", "C": "x"}) == {"A": "***", "B": "${B}", "C": "x"}
