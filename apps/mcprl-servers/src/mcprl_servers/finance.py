"""Finance MCP server over the shipped fixture: quotes, daily history, profiles, statements, symbol search.

Shaped like a market-data API with realistic errors (unknown symbol with suggestions, malformed or
out-of-range dates). Run it with ``python -m mcprl_servers.finance``.
"""

from __future__ import annotations

import bisect
import datetime as dt
import difflib
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.fixture import load_fixture
from mcprl_servers.results import to_json

__all__ = ["MAX_HISTORY_DAYS", "FinanceData", "build_server", "main"]

MAX_HISTORY_DAYS = 366
Statement = Literal["income", "balance", "cashflow"]
_STATEMENTS: tuple[str, ...] = ("income", "balance", "cashflow")


class FinanceData:
    """Read-only queries over the fixture; every method returns a JSON-ready value or raises ToolError.

    Args:
        fixture: A fixture as returned by :func:`mcprl_servers.fixture.load_fixture`.
    """

    def __init__(self, fixture: dict[str, Any]) -> None:
        self._fixture = fixture
        self._companies: dict[str, Any] = fixture["companies"]
        self._dates: list[str] = fixture["dates"]
        self._currency: str = fixture["currency"]

    def _company(self, symbol: str) -> tuple[str, dict[str, Any]]:
        key = symbol.strip().upper().lstrip("$")
        company = self._companies.get(key)
        if company is None:
            if not key:
                raise ToolError("symbol must not be empty")
            close = difflib.get_close_matches(key, list(self._companies), n=3, cutoff=0.5)
            hint = f" Did you mean: {', '.join(close)}?" if close else " Use search_symbols to find symbols."
            raise ToolError(f"Unknown symbol '{key}'.{hint}")
        return key, company

    def quote(self, symbol: str) -> dict[str, Any]:
        """Latest price (the last close in the fixture)."""
        key, company = self._company(symbol)
        return {"symbol": key, "price": company["prices"][-1][3], "currency": self._currency}

    def _date(self, text: str, name: str) -> dt.date:
        try:
            return dt.date.fromisoformat(text.strip())
        except ValueError:
            raise ToolError(f"{name} must be a date like 2025-03-14, got '{text}'") from None

    def history(self, symbol: str, start: str, end: str) -> dict[str, Any]:
        """Daily OHLCV rows with ``start <= date <= end``."""
        key, company = self._company(symbol)
        first, last = self._date(start, "start"), self._date(end, "end")
        if first > last:
            raise ToolError(f"start {first} is after end {last}")
        if (last - first).days > MAX_HISTORY_DAYS:
            raise ToolError(f"date range too long: at most {MAX_HISTORY_DAYS} days per request")
        lo_date, hi_date = self._dates[0], self._dates[-1]
        if last.isoformat() < lo_date or first.isoformat() > hi_date:
            raise ToolError(f"no data for {first}..{last}: history covers {lo_date} to {hi_date}")
        lo = bisect.bisect_left(self._dates, first.isoformat())
        hi = bisect.bisect_right(self._dates, last.isoformat())
        if lo == hi:
            raise ToolError(f"no trading days between {first} and {last}")
        rows = [[self._dates[i], *company["prices"][i]] for i in range(lo, hi)]
        return {
            "symbol": key,
            "currency": self._currency,
            "fields": ["date", *self._fixture["fields"]],
            "rows": rows,
        }

    def profile(self, symbol: str) -> dict[str, Any]:
        """Company profile (name, sector, headquarters, market cap, ...)."""
        _, company = self._company(symbol)
        return company["profile"]

    def financials(self, symbol: str, statement: str) -> dict[str, Any]:
        """Annual statement (USD millions) for the fiscal years in the fixture."""
        key, company = self._company(symbol)
        kind = statement.strip().lower()
        if kind not in _STATEMENTS:
            raise ToolError(f"statement must be one of {', '.join(_STATEMENTS)}, got '{statement}'")
        return {
            "symbol": key,
            "statement": kind,
            "unit": "USD millions",
            "years": company["financials"][kind],
        }

    def search(self, query: str) -> dict[str, Any]:
        """Companies whose symbol or name matches ``query`` (case-insensitive), best first, at most 10."""
        needle = query.strip().lower()
        if not needle:
            raise ToolError("query must not be empty")
        scored: list[tuple[int, str]] = []
        for symbol, company in self._companies.items():
            name = company["profile"]["name"].lower()
            if symbol.lower() == needle:
                scored.append((0, symbol))
            elif symbol.lower().startswith(needle) or name.startswith(needle):
                scored.append((1, symbol))
            elif needle in name:
                scored.append((2, symbol))
        scored.sort()
        results = [{"symbol": s, "name": self._companies[s]["profile"]["name"]} for _, s in scored[:10]]
        return {"results": results}


def build_server(fixture: dict[str, Any] | None = None) -> MCPServer:
    """Build the finance server.

    Args:
        fixture: Data to serve; the shipped fixture when None.
    """
    data = FinanceData(fixture if fixture is not None else load_fixture())
    server = MCPServer(
        "finance", instructions="Market data for listed companies (prices in USD).", log_level="WARNING"
    )

    @server.tool(structured_output=False)
    def get_quote(symbol: str) -> str:
        """Latest price of a stock, e.g. symbol 'HLDR'."""
        return to_json(data.quote(symbol))

    @server.tool(structured_output=False)
    def get_history(symbol: str, start: str, end: str) -> str:
        """Daily prices (open, high, low, close, volume) between two dates (YYYY-MM-DD), inclusive."""
        return to_json(data.history(symbol, start, end))

    @server.tool(structured_output=False)
    def get_profile(symbol: str) -> str:
        """Company profile: name, sector, industry, headquarters, founded, CEO, employees, market cap."""
        return to_json(data.profile(symbol))

    @server.tool(structured_output=False)
    def search_symbols(query: str) -> str:
        """Find stock symbols by company name or symbol prefix."""
        return to_json(data.search(query))

    @server.tool(structured_output=False)
    def get_financials(symbol: str, statement: Statement) -> str:
        """Annual financial statement in USD millions: statement is 'income', 'balance' or 'cashflow'."""
        return to_json(data.financials(symbol, statement))

    return server


def main() -> None:
    """Serve the finance data over stdio."""
    build_server().run()


if __name__ == "__main__":
    main()
