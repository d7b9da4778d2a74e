from __future__ import annotations

import datetime as dt
import re
from importlib import resources

from mcprl_servers.fixture import (
    FIXTURE_END,
    FIXTURE_SEED,
    FIXTURE_START,
    N_COMPANIES,
    fixture_bytes,
    generate_fixture,
    load_fixture,
)


def test_shipped_fixture_equals_the_generator_output() -> None:
    shipped = resources.files("mcprl_servers").joinpath("data", "finance_fixture.json").read_bytes()
    assert shipped == fixture_bytes(generate_fixture(FIXTURE_SEED))


def test_generation_is_deterministic_and_seed_dependent() -> None:
    assert fixture_bytes(generate_fixture(7)) == fixture_bytes(generate_fixture(7))
    assert fixture_bytes(generate_fixture(7)) != fixture_bytes(generate_fixture(8))


def test_companies_have_unique_four_letter_symbols_and_names() -> None:
    companies = load_fixture()["companies"]
    assert len(companies) == N_COMPANIES
    assert all(re.fullmatch(r"[A-Z]{4}", s) for s in companies)
    names = [c["profile"]["name"] for c in companies.values()]
    assert len(set(names)) == len(names)


def test_prices_are_positive_two_decimal_daily_rows_on_weekdays() -> None:
    fixture = load_fixture()
    dates = [dt.date.fromisoformat(d) for d in fixture["dates"]]
    assert dates[0] == FIXTURE_START
    assert dates[-1] == FIXTURE_END
    assert all(d.weekday() < 5 for d in dates)
    for company in fixture["companies"].values():
        assert len(company["prices"]) == len(dates)
        for open_, high, low, close, volume in company["prices"]:
            assert 0 < low <= min(open_, close) <= max(open_, close) <= high
            assert round(close, 2) == close
            assert volume > 0


def test_statements_cover_three_fiscal_years() -> None:
    for company in load_fixture()["companies"].values():
        for statement in ("income", "balance", "cashflow"):
            assert sorted(company["financials"][statement]) == ["2022", "2023", "2024"]
