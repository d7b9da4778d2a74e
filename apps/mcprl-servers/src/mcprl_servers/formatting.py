"""Short decimal text for exact numbers: what the calculator returns and what task answers are written as.

Rule (documented in the calculator's tool description): integers below 10**21 are printed exactly; other
values are rounded to 6 decimal places (halves away from zero) with trailing zeros stripped
(``126.51``, ``3.231418``, ``0.5``). A non-zero value that rounds to 0, or one of magnitude ≥ 10**21, is
printed in scientific notation with 7 significant digits (``1.234568e-09``).
"""

from __future__ import annotations

import decimal
from fractions import Fraction

__all__ = ["DECIMAL_PLACES", "format_number"]

DECIMAL_PLACES = 6
_BIG = 10**21


def _to_decimal(value: Fraction, digits: int) -> decimal.Decimal:
    with decimal.localcontext() as ctx:
        ctx.prec = digits
        return decimal.Decimal(value.numerator) / decimal.Decimal(value.denominator)


def _scientific(value: Fraction) -> str:
    magnitude = max(len(str(abs(value.numerator))), len(str(value.denominator)))
    d = _to_decimal(value, magnitude + 20)
    mantissa, _, exponent = f"{d:.6e}".partition("e")
    mantissa = mantissa.rstrip("0").rstrip(".") if "." in mantissa else mantissa
    return f"{mantissa}e{exponent}"


def format_number(value: Fraction | int, places: int = DECIMAL_PLACES) -> str:
    """Render an exact number as short decimal text.

    Args:
        value: The exact value.
        places: Decimal places kept before stripping trailing zeros.

    Returns:
        Text such as ``"126.51"``, ``"-3"``, ``"0.333333"`` or ``"1.5e+30"``.
    """
    q = Fraction(value)
    if q.denominator == 1 and abs(q) < _BIG:
        return str(q.numerator)
    if abs(q) >= _BIG:
        return _scientific(q)
    scale = 10**places
    scaled = abs(q) * scale
    rounded = int(scaled + Fraction(1, 2))
    if rounded == 0:
        return _scientific(q)
    whole, frac = divmod(rounded, scale)
    text = str(whole)
    if frac:
        text += "." + str(frac).rjust(places, "0").rstrip("0")
    return "-" + text if q < 0 else text
