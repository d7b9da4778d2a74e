from __future__ import annotations

from fractions import Fraction

import pytest

from mcprl_servers.formatting import format_number


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (Fraction("126.51"), "126.51"),
        (Fraction(7), "7"),
        (Fraction(-3), "-3"),
        (Fraction(0), "0"),
        (Fraction(1, 3), "0.333333"),
        (Fraction(2, 3), "0.666667"),
        (Fraction(-1, 7), "-0.142857"),
        (Fraction("0.5"), "0.5"),
        (Fraction("2.0000004"), "2"),
        (Fraction("0.0000005"), "0.000001"),
        (Fraction(1, 10**9), "1e-9"),
        (Fraction(-123456789, 10**17), "-1.234568e-9"),
        (Fraction(2**100), "1.267651e+30"),
        (Fraction(10**20), "100000000000000000000"),
    ],
)
def test_numbers_are_short_decimals(value: Fraction, text: str) -> None:
    assert format_number(value) == text


def test_more_places_can_be_requested() -> None:
    assert format_number(Fraction(1, 3), places=10) == "0.3333333333"
