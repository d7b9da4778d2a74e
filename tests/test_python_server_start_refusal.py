"""A python sandbox that cannot isolate fails the server's start, through the tool manager: a start-up error
with the reason, never a tool error scored against the model (issue 18 item 12).

The kernel's refusal itself (no user namespace left for a server without root) is in
apps/mcprl-servers/tests/test_python_sandbox_rootless.py; here ``unshare`` is a command that fails.
"""

from __future__ import annotations

import sys

import pytest

from mcprl_tools import ServersConfig, ServerStartError, ToolManager

pytestmark = pytest.mark.anyio


async def test_a_sandbox_that_cannot_isolate_fails_the_start_with_its_reason() -> None:
    config = ServersConfig.from_dict(
        {
            "mcpServers": {
                "python": {
                    "command": sys.executable,
                    "args": ["-m", "mcprl_servers.python_sandbox"],
                    "env": {"MCPRL_SANDBOX_UNSHARE_PATH": "/bin/false"},
                }
            }
        },
        source="<test>",
    )
    with pytest.raises(ServerStartError) as caught:
        async with ToolManager(config):
            pytest.fail("the python server started without isolation")
    message = str(caught.value)
    assert "server 'python'" in message
    assert "refusing to start: python sandbox unavailable (namespaces isolation)" in message
    assert "MCPRL_SANDBOX_ISOLATION=process" in message
