"""The search corpus: short news, overview, earnings and glossary documents about the fixture companies.

Generated deterministically from the finance fixture and a seed, and shipped as
``mcprl_servers/data/search_corpus.json`` (regenerate with ``python -m mcprl_servers.corpus``; a test checks
the shipped bytes). Company events (acquisitions, new facilities, executive appointments, partnerships,
product launches) exist only here, so questions about them need the search server.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import random
from importlib import resources
from typing import Any

from mcprl_servers.errors import FixtureError
from mcprl_servers.fixture import load_fixture

__all__ = ["CORPUS_COMPANIES", "CORPUS_SEED", "EVENT_KINDS", "corpus_bytes", "generate_corpus", "load_corpus"]

CORPUS_SEED = 7
# The corpus describes the fixture's first 40 companies only: the search tasks and their shipped presets are
# written against these 40, while the demo's tasks use all of the fixture's companies.
CORPUS_COMPANIES = 40
_FILE = "search_corpus.json"
EVENT_KINDS: tuple[str, ...] = ("acquisition", "facility", "cfo", "partnership", "product")
_EVENTS_PER_COMPANY = 2
_TARGETS = (
    "Quillon",
    "Brisk",
    "Arvata",
    "Meridal",
    "Tessary",
    "Olvane",
    "Corrix",
    "Pentara",
    "Velloq",
    "Istra",
)
_TARGET_SUFFIX = ("Analytics", "Robotics", "Materials", "Diagnostics", "Logistics", "Software")
_PRODUCTS = ("Atlas", "Nimbus", "Orion", "Helix", "Vega", "Pulse", "Quartz", "Lumen", "Strata", "Nova")
_PRODUCT_KIND = ("platform", "sensor", "service", "engine", "suite", "device")
_PEOPLE_FIRST = ("Maya", "Tomas", "Priya", "Oskar", "Leila", "Victor", "Noor", "Sven", "Amara", "Diego")
_PEOPLE_LAST = ("Brandt", "Castillo", "Haddad", "Ivanova", "Kowalski", "Mensah", "Ortega", "Sato", "Virtanen")
_GLOSSARY: tuple[tuple[str, str], ...] = (
    ("Price-to-earnings ratio", "The price-to-earnings ratio divides a company's share price by its earnings per share."),
    ("Market capitalization", "Market capitalization is the share price multiplied by the number of shares outstanding."),
    ("Free cash flow", "Free cash flow is operating cash flow minus capital expenditure."),
    ("Gross margin", "Gross margin is gross profit divided by revenue, usually shown as a percentage."),
    ("Operating income", "Operating income is gross profit minus operating expenses such as research and sales."),
    ("Dividend yield", "Dividend yield is the annual dividend per share divided by the share price."),
    ("Shareholders' equity", "Shareholders' equity is total assets minus total liabilities."),
    ("Trading day", "A trading day is a weekday on which the exchange is open; weekends have no prices."),
    ("Ticker symbol", "A ticker symbol is the short code under which a company's shares trade, such as four letters."),
    ("Closing price", "The closing price is the last traded price of a share at the end of a trading day."),
    ("Trading volume", "Trading volume counts the shares that changed hands during a trading day."),
    ("Price ratio", "A price ratio compares two share prices by dividing one by the other."),
    ("Balance sheet", "A balance sheet lists a company's assets, liabilities and equity at a point in time."),
    ("Income statement", "An income statement reports revenue, costs and profit over a fiscal year."),
    ("Cash flow statement", "A cash flow statement shows cash from operations, investment and financing."),
    ("Capital expenditure", "Capital expenditure is money spent on long-lived assets such as plants and equipment."),
    ("Fiscal year", "A fiscal year is the twelve-month period a company uses for its financial reports."),
    ("Sector", "A sector groups companies with similar businesses, such as energy or healthcare."),
    ("Exchange", "An exchange is a marketplace where shares are listed and traded."),
    ("Net income", "Net income is the profit left after all expenses, interest and taxes."),
)  # fmt: skip


def _date(rng: random.Random) -> dt.date:
    return dt.date(2025, 1, 1) + dt.timedelta(days=rng.randrange(364))


def _event(rng: random.Random, kind: str, p: dict[str, Any], others: list[str]) -> tuple[str, str, str]:
    """(title, text, fact) of one company event."""
    name, symbol, city = p["name"], p["symbol"], p["headquarters"].upper()
    day = _date(rng)
    when = f"{day:%B} {day.day}, {day.year}"
    lead = f"{city}, {when} — {name} ({symbol}) shared an update with investors on its plans for the coming year."
    match kind:
        case "acquisition":
            fact = f"{rng.choice(_TARGETS)} {rng.choice(_TARGET_SUFFIX)}"
            return (
                f"{name} completes acquisition",
                f"{lead} The company completed the acquisition of {fact}.",
                fact,
            )
        case "facility":
            fact = rng.choice([c for c in ("Lakeview", "Eastbridge", "Silverton", "Harborview", "Millbrook",
                                           "Fairhaven", "Stonegate", "Brightwater") if c.upper() != city])  # fmt: skip
            return f"{name} opens new facility", f"{lead} It opened a new facility in {fact}.", fact
        case "cfo":
            fact = f"{rng.choice(_PEOPLE_FIRST)} {rng.choice(_PEOPLE_LAST)}"
            return (
                f"{name} names new finance chief",
                f"{lead} It appointed {fact} as chief financial officer.",
                fact,
            )
        case "partnership":
            fact = rng.choice(others)
            return f"{name} announces partnership", f"{lead} It announced a partnership with {fact}.", fact
        case "product":
            fact = f"{rng.choice(_PRODUCTS)} {rng.randint(2, 9)}"
            kind_word = rng.choice(_PRODUCT_KIND)
            return (
                f"{name} launches new {kind_word}",
                f"{lead} It launched {fact}, its new {kind_word}.",
                fact,
            )
        case _:
            raise ValueError(f"unknown event kind {kind!r}")


def _company_docs(rng: random.Random, company: dict[str, Any], names: list[str]) -> list[dict[str, Any]]:
    p = company["profile"]
    name, symbol = p["name"], p["symbol"]
    docs: list[dict[str, Any]] = [
        {
            "title": f"{name} ({symbol}) company overview",
            "text": f"{p['description']} {name} is led by chief executive {p['ceo']} and employs about "
            f"{p['employees']:,} people. Its shares trade on the {p['exchange']} under the symbol {symbol}.",
            "meta": {"kind": "overview", "symbol": symbol},
        }
    ]
    for year, income in company["financials"]["income"].items():
        docs.append(
            {
                "title": f"{name} reports fiscal {year} results",
                "text": f"{name} ({symbol}) reported fiscal {year} revenue of ${income['revenue']:,} million and "
                f"net income of ${income['net_income']:,} million.",
                "meta": {"kind": "earnings", "symbol": symbol, "year": int(year)},
            }
        )
    others = [n for n in names if n != name]
    for kind in rng.sample(EVENT_KINDS, _EVENTS_PER_COMPANY):
        title, text, fact = _event(rng, kind, p, others)
        docs.append({"title": title, "text": text, "meta": {"kind": kind, "symbol": symbol, "fact": fact}})
    return docs


def generate_corpus(seed: int = CORPUS_SEED, fixture: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Generate the corpus.

    Args:
        seed: Random seed; :data:`CORPUS_SEED` gives the shipped corpus.
        fixture: Finance fixture to describe; the shipped one when None.

    Returns:
        Documents ``{"doc_id", "title", "text", "meta"}`` (``meta`` records the kind, symbol and, for
        events, the fact — used by the task generators, never shown by the server).
    """
    data = fixture if fixture is not None else load_fixture()
    rng = random.Random(seed)
    companies = list(data["companies"].values())[:CORPUS_COMPANIES]
    names = [c["profile"]["name"] for c in companies]
    docs: list[dict[str, Any]] = []
    for company in companies:
        docs.extend(_company_docs(rng, company, names))
    docs.extend({"title": t, "text": x, "meta": {"kind": "glossary"}} for t, x in _GLOSSARY)
    rng.shuffle(docs)
    return [{"doc_id": f"doc-{i:04d}", **d} for i, d in enumerate(docs, start=1)]


def corpus_bytes(docs: list[dict[str, Any]]) -> bytes:
    """Serialise documents exactly as the shipped file is written (one document per line)."""
    body = ",\n".join(json.dumps(d, ensure_ascii=False, separators=(",", ":")) for d in docs)
    return ("[\n" + body + "\n]\n").encode()


@functools.cache
def load_corpus() -> list[dict[str, Any]]:
    """The shipped corpus (parsed once per process).

    Raises:
        FixtureError: The data file is missing from the installed package.
    """
    try:
        data = resources.files("mcprl_servers").joinpath("data", _FILE).read_bytes()
    except FileNotFoundError as exc:
        raise FixtureError(
            f"mcprl_servers/data/{_FILE} is missing; regenerate it with `python -m mcprl_servers.corpus`"
        ) from exc
    return json.loads(data)


def main() -> None:
    """Write the corpus for :data:`CORPUS_SEED` into the package's data directory."""
    target = resources.files("mcprl_servers").joinpath("data", _FILE)
    with resources.as_file(target) as path:
        path.write_bytes(corpus_bytes(generate_corpus()))
        print(path)


if __name__ == "__main__":
    main()
