from __future__ import annotations

import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from mcprl_servers.calculator import build_server, calculate_text

pytestmark = pytest.mark.anyio


def _text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def test_calculate_tool_returns_an_exact_short_decimal() -> None:
    async with Client(build_server()) as client:
        tools = await client.list_tools()
        assert [t.name for t in tools.tools] == ["calculate"]
        assert tools.tools[0].input_schema["required"] == ["expression"]
        result = await client.call_tool("calculate", {"expression": "3 * 42.17"})
        assert not result.is_error
        assert _text(result) == "126.51"
        assert _text(await client.call_tool("calculate", {"expression": "0.1 + 0.2"})) == "0.3"


@pytest.mark.parametrize(
    ("expression", "reason"),
    [("1 / 0", "division by zero"), ("2 ** 99999", "exponent too large"), ("__import__('os')", "unexpected")],
)
async def test_calculate_errors_are_tool_errors_with_the_reason(expression: str, reason: str) -> None:
    async with Client(build_server()) as client:
        result = await client.call_tool("calculate", {"expression": expression})
        assert result.is_error
        assert reason in _text(result)


def test_calculate_text_matches_the_tool_output_format() -> None:
    assert calculate_text("42.17 / 13.05") == "3.231418"
    assert calculate_text("21.0") == "21"


async def test_calculator_runs_as_a_stdio_server() -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcprl_servers.calculator"])
    with anyio.fail_after(30):
        async with Client(params) as client:
            result = await client.call_tool("calculate", {"expression": "round(42.17 / 13.05, 2)"})
            assert _text(result) == "3.23"
            bad = await client.call_tool("calculate", {"expression": "1/0"})
            assert bad.is_error
