from __future__ import annotations

import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import TextContent

from mcprl_servers import SERVER_NAMES, default_servers_config


def test_default_config_launches_each_server_module_with_this_interpreter() -> None:
    config = default_servers_config(["calculator", "messaging"])
    assert config == {
        "mcpServers": {
            "calculator": {
                "command": sys.executable,
                "args": ["-m", "mcprl_servers.calculator"],
                "stateful": False,
            },
            "messaging": {
                "command": sys.executable,
                "args": ["-m", "mcprl_servers.messaging"],
                "stateful": True,
            },
        }
    }


def test_default_config_without_names_has_every_server() -> None:
    servers = default_servers_config()["mcpServers"]
    assert isinstance(servers, dict)
    assert list(servers) == list(SERVER_NAMES)


def test_unknown_server_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="calculator"):
        default_servers_config(["calculater"])


@pytest.mark.anyio
async def test_config_entries_start_working_servers() -> None:
    servers = default_servers_config(["finance"])["mcpServers"]
    assert isinstance(servers, dict)
    entry = servers["finance"]
    params = StdioServerParameters(command=entry["command"], args=entry["args"])
    with anyio.fail_after(30):
        async with Client(params) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert names == {"get_quote", "get_history", "get_profile", "search_symbols", "get_financials"}
            result = await client.call_tool("search_symbols", {"query": "labs"})
            (content,) = result.content
            assert isinstance(content, TextContent)
            assert '"results"' in content.text
