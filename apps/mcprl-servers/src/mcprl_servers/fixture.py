"""The finance fixture: made-up companies, daily prices, profiles and statements generated from a seed.

The generated data is shipped as ``mcprl_servers/data/finance_fixture.json`` so the server and the task
generators read the same bytes; :func:`generate_fixture` regenerates it (a test checks the shipped file equals
the output for :data:`FIXTURE_SEED`). Regenerate with ``python -m mcprl_servers.fixture``.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import random
from importlib import resources
from typing import Any

from mcprl_servers.errors import FixtureError

__all__ = [
    "FIXTURE_END",
    "FIXTURE_SEED",
    "FIXTURE_START",
    "N_COMPANIES",
    "fixture_bytes",
    "generate_fixture",
    "load_fixture",
]

FIXTURE_SEED = 20261122
FIXTURE_START = dt.date(2025, 1, 2)
FIXTURE_END = dt.date(2025, 12, 31)
N_COMPANIES = 200
_FISCAL_YEARS = (2022, 2023, 2024)
_FILE = "finance_fixture.json"

_SYLLABLES = (
    "ka", "lo", "mi", "ne", "tor", "vi", "zen", "bra", "qua", "ri", "so", "fel", "dra", "mon", "pax",
    "ul", "cor", "ten", "vas", "gri", "hel", "ox", "pel", "sar", "ty", "nor", "lex", "wen", "jun", "bel",
)  # fmt: skip
_SECTORS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "Technology": (
        ("Software", "Semiconductors", "Cloud Services"),
        ("Systems", "Labs", "Networks", "Logic"),
    ),
    "Healthcare": (
        ("Biotechnology", "Medical Devices", "Pharmaceuticals"),
        ("Therapeutics", "Health", "Bio"),
    ),
    "Financials": (("Banking", "Insurance", "Asset Management"), ("Bank", "Capital", "Financial")),
    "Energy": (("Oil & Gas", "Renewables", "Utilities"), ("Energy", "Power", "Solar")),
    "Consumer": (("Food & Beverage", "Retail", "Apparel"), ("Foods", "Brands", "Goods")),
    "Industrials": (("Aerospace", "Machinery", "Logistics"), ("Industries", "Motors", "Freight")),
}
_CITIES = (
    "Northport", "Lakeview", "Eastbridge", "Redmond Falls", "Silverton", "Harborview", "Westfield",
    "Cedar Rapids", "Stonegate", "Millbrook", "Fairhaven", "Brightwater",
)  # fmt: skip
_FIRST = ("Ada", "Ben", "Clara", "Dev", "Elena", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kira", "Liam")
_LAST = ("Okafor", "Lindqvist", "Moreau", "Tanaka", "Alvarez", "Novak", "Reyes", "Schmidt", "Iyer", "Walsh")


def _trading_days() -> list[dt.date]:
    days: list[dt.date] = []
    day = FIXTURE_START
    while day <= FIXTURE_END:
        if day.weekday() < 5:
            days.append(day)
        day += dt.timedelta(days=1)
    return days


def _name(rng: random.Random, used: set[str]) -> str:
    while True:
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if 4 <= len(word) <= 9 and word not in used:
            used.add(word)
            return word


def _symbol(rng: random.Random, word: str, used: set[str]) -> str:
    letters = [c for c in word.upper() if c.isalpha()]
    consonants = [c for c in letters[1:] if c not in "AEIOU"]
    candidate = (letters[0] + "".join(consonants))[:4]
    while len(candidate) < 4 or candidate in used:
        candidate = letters[0] + "".join(rng.choice("BCDFGHKLMNPRSTVXZ") for _ in range(3))
    used.add(candidate)
    return candidate


def _prices(rng: random.Random, n: int) -> list[list[float | int]]:
    price = math.exp(rng.uniform(math.log(8.0), math.log(400.0)))
    drift, vol = rng.uniform(-0.0005, 0.0012), rng.uniform(0.008, 0.03)
    base_volume = rng.randint(200_000, 20_000_000)
    rows: list[list[float | int]] = []
    for _ in range(n):
        open_ = price
        close = max(1.0, price * math.exp(rng.gauss(drift, vol)))
        high = max(open_, close) * (1 + abs(rng.gauss(0, vol / 2)))
        low = min(open_, close) * (1 - abs(rng.gauss(0, vol / 2)))
        volume = int(base_volume * math.exp(rng.gauss(0, 0.35)))
        rows.append([round(open_, 2), round(high, 2), round(low, 2), round(close, 2), volume])
        price = close
    return rows


def _statements(rng: random.Random, market_cap: float) -> dict[str, dict[str, dict[str, float]]]:
    revenue = market_cap * rng.uniform(0.15, 1.2) / 1e6
    out: dict[str, dict[str, dict[str, float]]] = {"income": {}, "balance": {}, "cashflow": {}}
    for year in _FISCAL_YEARS:
        revenue *= rng.uniform(0.92, 1.25)
        gross = revenue * rng.uniform(0.25, 0.75)
        operating = gross * rng.uniform(0.1, 0.6)
        net = operating * rng.uniform(0.55, 0.85)
        assets = revenue * rng.uniform(0.8, 2.5)
        liabilities = assets * rng.uniform(0.3, 0.75)
        operating_cf = net * rng.uniform(1.0, 1.5)
        capex = revenue * rng.uniform(0.02, 0.12)
        key = str(year)
        out["income"][key] = {
            "revenue": round(revenue, 1),
            "gross_profit": round(gross, 1),
            "operating_income": round(operating, 1),
            "net_income": round(net, 1),
        }
        out["balance"][key] = {
            "total_assets": round(assets, 1),
            "total_liabilities": round(liabilities, 1),
            "shareholders_equity": round(assets - liabilities, 1),
            "cash": round(assets * rng.uniform(0.05, 0.3), 1),
        }
        out["cashflow"][key] = {
            "operating_cash_flow": round(operating_cf, 1),
            "capital_expenditure": round(-capex, 1),
            "free_cash_flow": round(operating_cf - capex, 1),
        }
    return out


def _article(word: str) -> str:
    return "an" if word[0].lower() in "aeiou" else "a"


def _company(rng: random.Random, names: set[str], symbols: set[str], n_days: int) -> dict[str, Any]:
    sector = rng.choice(sorted(_SECTORS))
    industries, suffixes = _SECTORS[sector]
    word = _name(rng, names)
    name = f"{word} {rng.choice(suffixes)}"
    symbol = _symbol(rng, word, symbols)
    prices = _prices(rng, n_days)
    shares = rng.randint(20, 3000) * 1_000_000
    market_cap = float(prices[-1][3]) * shares
    city = rng.choice(_CITIES)
    industry = rng.choice(industries)
    founded = rng.randint(1950, 2015)
    profile = {
        "symbol": symbol,
        "name": name,
        "sector": sector,
        "industry": industry,
        "exchange": rng.choice(("NXSE", "QMKT")),
        "headquarters": city,
        "founded": founded,
        "ceo": f"{rng.choice(_FIRST)} {rng.choice(_LAST)}",
        "employees": rng.randint(120, 90_000),
        "shares_outstanding": shares,
        "market_cap": round(market_cap),
        "description": f"{name} is {_article(industry)} {industry.lower()} company headquartered in {city}, founded in {founded}.",
    }
    return {"profile": profile, "prices": prices, "financials": _statements(rng, market_cap)}


def generate_fixture(seed: int = FIXTURE_SEED) -> dict[str, Any]:
    """Generate the whole fixture deterministically.

    Args:
        seed: Random seed; :data:`FIXTURE_SEED` gives the shipped data.

    Returns:
        ``{"seed", "currency", "dates": [...], "fields": [...], "companies": {symbol: {"profile",
        "prices", "financials"}}}``; companies keep generation order, prices are ``[open, high, low, close,
        volume]`` per trading day.
    """
    rng = random.Random(seed)
    days = _trading_days()
    names: set[str] = set()
    symbols: set[str] = set()
    companies: dict[str, Any] = {}
    for _ in range(N_COMPANIES):
        company = _company(rng, names, symbols, len(days))
        companies[company["profile"]["symbol"]] = company
    return {
        "seed": seed,
        "currency": "USD",
        "dates": [d.isoformat() for d in days],
        "fields": ["open", "high", "low", "close", "volume"],
        "companies": companies,
    }


def fixture_bytes(fixture: dict[str, Any]) -> bytes:
    """Serialise a fixture exactly as the shipped file is written (compact, one company per line)."""
    head = {k: v for k, v in fixture.items() if k != "companies"}
    lines = [json.dumps(head, separators=(",", ":"))[:-1] + ',"companies":{']
    items = list(fixture["companies"].items())
    for i, (symbol, company) in enumerate(items):
        sep = "," if i < len(items) - 1 else ""
        lines.append(f"{json.dumps(symbol)}:{json.dumps(company, separators=(',', ':'))}{sep}")
    lines.append("}}")
    return ("\n".join(lines) + "\n").encode()


@functools.cache
def load_fixture() -> dict[str, Any]:
    """The shipped fixture (parsed once per process).

    Raises:
        FixtureError: The data file is missing from the installed package.
    """
    try:
        data = resources.files("mcprl_servers").joinpath("data", _FILE).read_bytes()
    except FileNotFoundError as exc:
        raise FixtureError(
            f"mcprl_servers/data/{_FILE} is missing; regenerate it with `python -m mcprl_servers.fixture`"
        ) from exc
    return json.loads(data)


def main() -> None:
    """Write the fixture for :data:`FIXTURE_SEED` into the package's data directory."""
    target = resources.files("mcprl_servers").joinpath("data", _FILE)
    with resources.as_file(target) as path:
        path.write_bytes(fixture_bytes(generate_fixture()))
        print(path)


if __name__ == "__main__":
    main()
