from __future__ import annotations

import json
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from mcprl_servers.finance import build_server
from mcprl_servers.fixture import load_fixture

pytestmark = pytest.mark.anyio

SYMBOL = next(iter(load_fixture()["companies"]))


def _text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def _call(name: str, **arguments: object) -> CallToolResult:
    async with Client(build_server()) as client:
        return await client.call_tool(name, arguments)


async def test_quote_is_a_short_json_with_the_last_close() -> None:
    result = await _call("get_quote", symbol=SYMBOL)
    last_close = load_fixture()["companies"][SYMBOL]["prices"][-1][3]
    assert _text(result) == json.dumps(
        {"symbol": SYMBOL, "price": last_close, "currency": "USD"}, separators=(",", ":")
    )


async def test_symbols_are_case_insensitive() -> None:
    result = await _call("get_quote", symbol=f" {SYMBOL.lower()} ")
    assert json.loads(_text(result))["symbol"] == SYMBOL


async def test_unknown_symbol_suggests_close_matches() -> None:
    typo = SYMBOL[:3] + ("X" if SYMBOL[3] != "X" else "Y")
    result = await _call("get_quote", symbol=typo)
    assert result.is_error
    assert f"Unknown symbol '{typo}'" in _text(result)
    assert SYMBOL in _text(result)


async def test_history_returns_inclusive_trading_days() -> None:
    result = await _call("get_history", symbol=SYMBOL, start="2025-12-27", end="2025-12-31")
    body = json.loads(_text(result))
    assert body["fields"] == ["date", "open", "high", "low", "close", "volume"]
    assert [row[0] for row in body["rows"]] == ["2025-12-29", "2025-12-30", "2025-12-31"]
    assert body["rows"][-1][4] == load_fixture()["companies"][SYMBOL]["prices"][-1][3]


@pytest.mark.parametrize(
    ("start", "end", "reason"),
    [
        ("2025-06-10", "2025-06-01", "after end"),
        ("2025-13-01", "2025-12-31", "must be a date"),
        ("yesterday", "2025-12-31", "must be a date"),
        ("2020-01-01", "2020-02-01", "history covers 2025-01-02 to 2025-12-31"),
        ("2024-01-01", "2025-12-31", "too long"),
        ("2025-01-04", "2025-01-05", "no trading days"),
    ],
)
async def test_bad_date_ranges_are_tool_errors(start: str, end: str, reason: str) -> None:
    result = await _call("get_history", symbol=SYMBOL, start=start, end=end)
    assert result.is_error
    assert reason in _text(result)


async def test_profile_and_financials_hold_the_bulky_fields() -> None:
    profile = json.loads(_text(await _call("get_profile", symbol=SYMBOL)))
    assert {"name", "sector", "industry", "headquarters", "founded", "ceo", "market_cap"} <= set(profile)
    income = json.loads(_text(await _call("get_financials", symbol=SYMBOL, statement="income")))
    assert income["unit"] == "USD millions"
    assert set(income["years"]["2024"]) == {"revenue", "gross_profit", "operating_income", "net_income"}


async def test_unknown_statement_is_rejected() -> None:
    result = await _call("get_financials", symbol=SYMBOL, statement="dividends")
    assert result.is_error


async def test_search_symbols_finds_by_name_and_symbol() -> None:
    name = load_fixture()["companies"][SYMBOL]["profile"]["name"]
    by_name = json.loads(_text(await _call("search_symbols", query=name.split()[0].lower())))
    assert by_name["results"][0] == {"symbol": SYMBOL, "name": name}
    by_symbol = json.loads(_text(await _call("search_symbols", query=SYMBOL)))
    assert by_symbol["results"][0]["symbol"] == SYMBOL
    assert json.loads(_text(await _call("search_symbols", query="zzzzqqq"))) == {"results": []}


async def test_finance_runs_as_a_stdio_server() -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcprl_servers.finance"])
    with anyio.fail_after(30):
        async with Client(params) as client:
            result = await client.call_tool("get_quote", {"symbol": SYMBOL})
            assert json.loads(_text(result))["symbol"] == SYMBOL
            missing = await client.call_tool("get_quote", {"symbol": "QQQQ"})
            assert missing.is_error
