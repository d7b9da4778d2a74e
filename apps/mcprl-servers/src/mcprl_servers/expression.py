"""A safe, exact arithmetic expression evaluator (a small Pratt parser over :class:`fractions.Fraction`).

Model-written input is parsed by hand — never ``eval`` — and every operation is exact rational arithmetic,
so ``0.1 + 0.2`` is exactly ``0.3``. Supported: numbers (``42``, ``42.17``, ``.5``, ``1e3``), ``+ - * /``,
floor division ``//``, modulo ``%``, powers ``**`` and ``^`` (right-associative, binding tighter than unary
minus, so ``-2**2 == -4``), parentheses, ``×``/``÷``/``−``, and the functions ``abs(x)``, ``min(a, b, ...)``,
``max(a, b, ...)``, ``round(x[, n])`` (half away from zero) and ``sqrt(x)``. ``sqrt`` and non-integer powers
are the only inexact operations (computed with 40 significant digits).

Limits (each refusal is an :class:`~mcprl_servers.errors.ExpressionError` with a short, model-facing reason):
at most 1,000 characters, 64 levels of nesting, integer exponents up to 10,000 in magnitude, and no
intermediate value wider than 20,000 bits in numerator or denominator.
"""

from __future__ import annotations

import decimal
import re
from collections.abc import Callable
from fractions import Fraction

from mcprl_servers.errors import ExpressionError

__all__ = ["MAX_EXPRESSION_LENGTH", "evaluate"]

MAX_EXPRESSION_LENGTH = 1000
_MAX_DEPTH = 64
_MAX_EXPONENT = 10_000
_MAX_BITS = 20_000
_INEXACT_DIGITS = 40

_TOKEN = re.compile(
    r"\s*(?:(?P<num>(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d{1,4})?)|(?P<name>[A-Za-z_]\w*)|(?P<op>\*\*|//|[-+*/%^(),×÷−]))",
    re.ASCII,
)
_OP_ALIASES = {"×": "*", "÷": "/", "−": "-", "^": "**"}
# Binding powers (left, right) of the infix operators: ** is right-associative.
_INFIX: dict[str, tuple[int, int]] = {
    "+": (10, 11),
    "-": (10, 11),
    "*": (20, 21),
    "/": (20, 21),
    "//": (20, 21),
    "%": (20, 21),
    "**": (41, 40),
}
_PREFIX_POWER = 30


def _tokenize(text: str) -> list[tuple[str, str]]:
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:
            bad = text[pos:].lstrip()[:1]
            raise ExpressionError(f"unexpected character {bad!r}")
        pos = match.end()
        kind = match.lastgroup
        assert kind is not None
        value = match.group(kind)
        tokens.append((kind, _OP_ALIASES.get(value, value)))
    return tokens


def _check_size(value: Fraction) -> Fraction:
    if value.numerator.bit_length() > _MAX_BITS or value.denominator.bit_length() > _MAX_BITS:
        raise ExpressionError("number too large")
    return value


def _inexact(value: decimal.Decimal) -> Fraction:
    return _check_size(Fraction(value))


def _power(base: Fraction, exponent: Fraction) -> Fraction:
    if exponent.denominator == 1:
        exp = exponent.numerator
        if abs(exp) > _MAX_EXPONENT:
            raise ExpressionError(f"exponent too large (limit {_MAX_EXPONENT})")
        width = max(base.numerator.bit_length(), base.denominator.bit_length())
        if width > 1 and width * abs(exp) > _MAX_BITS:
            raise ExpressionError("result too large")
        if base == 0 and exp < 0:
            raise ExpressionError("division by zero")
        return base**exp
    if base < 0:
        raise ExpressionError("fractional power of a negative number")
    if base == 0:
        return Fraction(0)
    if abs(exponent) > _MAX_EXPONENT:
        raise ExpressionError(f"exponent too large (limit {_MAX_EXPONENT})")
    with decimal.localcontext() as ctx:
        ctx.prec = _INEXACT_DIGITS
        ctx.Emax, ctx.Emin = 6000, -6000
        ctx.traps[decimal.Overflow] = True
        try:
            b = decimal.Decimal(base.numerator) / decimal.Decimal(base.denominator)
            e = decimal.Decimal(exponent.numerator) / decimal.Decimal(exponent.denominator)
            return _inexact(b**e)
        except decimal.Overflow:
            raise ExpressionError("result too large") from None


def _divide(a: Fraction, b: Fraction, op: str) -> Fraction:
    if b == 0:
        raise ExpressionError("division by zero")
    match op:
        case "/":
            return a / b
        case "//":
            return Fraction(a // b)
        case _:
            return a % b


def _apply(op: str, a: Fraction, b: Fraction) -> Fraction:
    match op:
        case "+":
            return _check_size(a + b)
        case "-":
            return _check_size(a - b)
        case "*":
            return _check_size(a * b)
        case "/" | "//" | "%":
            return _check_size(_divide(a, b, op))
        case "**":
            return _check_size(_power(a, b))
        case _:
            raise ExpressionError(f"unknown operator {op!r}")


def round_half_up(value: Fraction, places: int) -> Fraction:
    """Round to ``places`` decimals, halves away from zero (what people expect of a calculator)."""
    scale = Fraction(10) ** places
    scaled = abs(value) * scale
    rounded = Fraction(int(scaled + Fraction(1, 2)), 1) / scale
    return rounded if value >= 0 else -rounded


def _round(args: list[Fraction]) -> Fraction:
    if len(args) not in (1, 2):
        raise ExpressionError("round takes 1 or 2 arguments")
    places = args[1] if len(args) == 2 else Fraction(0)
    if places.denominator != 1 or not 0 <= places <= 20:
        raise ExpressionError("round: digits must be an integer from 0 to 20")
    return round_half_up(args[0], int(places))


def _sqrt(args: list[Fraction]) -> Fraction:
    if len(args) != 1:
        raise ExpressionError("sqrt takes 1 argument")
    (x,) = args
    if x < 0:
        raise ExpressionError("square root of a negative number")
    return _power(x, Fraction(1, 2))


def _one(name: str, fn: Callable[[Fraction], Fraction]) -> Callable[[list[Fraction]], Fraction]:
    def call(args: list[Fraction]) -> Fraction:
        if len(args) != 1:
            raise ExpressionError(f"{name} takes 1 argument")
        return fn(args[0])

    return call


def _many(name: str, fn: Callable[[list[Fraction]], Fraction]) -> Callable[[list[Fraction]], Fraction]:
    def call(args: list[Fraction]) -> Fraction:
        if not args:
            raise ExpressionError(f"{name} takes at least 1 argument")
        return fn(args)

    return call


_FUNCTIONS: dict[str, Callable[[list[Fraction]], Fraction]] = {
    "abs": _one("abs", abs),
    "min": _many("min", min),
    "max": _many("max", max),
    "round": _round,
    "sqrt": _sqrt,
}


class _Parser:
    def __init__(self, tokens: list[tuple[str, str]]) -> None:
        self._tokens = tokens
        self._pos = 0
        self._depth = 0

    def _peek(self) -> tuple[str, str] | None:
        return self._tokens[self._pos] if self._pos < len(self._tokens) else None

    def _next(self) -> tuple[str, str]:
        token = self._peek()
        if token is None:
            raise ExpressionError("unexpected end of expression")
        self._pos += 1
        return token

    def _expect(self, op: str) -> None:
        token = self._next()
        if token != ("op", op):
            raise ExpressionError(f"expected {op!r} but found {token[1]!r}")

    def parse(self) -> Fraction:
        if not self._tokens:
            raise ExpressionError("empty expression")
        value = self._expression(0)
        token = self._peek()
        if token is not None:
            raise ExpressionError(f"unexpected {token[1]!r}")
        return value

    def _expression(self, min_power: int) -> Fraction:
        self._depth += 1
        if self._depth > _MAX_DEPTH:
            raise ExpressionError("expression nested too deeply")
        left = self._prefix()
        while (token := self._peek()) is not None and token[0] == "op" and token[1] in _INFIX:
            left_power, right_power = _INFIX[token[1]]
            if left_power < min_power:
                break
            self._pos += 1
            left = _apply(token[1], left, self._expression(right_power))
        self._depth -= 1
        return left

    def _prefix(self) -> Fraction:
        kind, value = self._next()
        match kind:
            case "num":
                return _check_size(Fraction(value))
            case "name":
                return self._call(value)
            case _:
                pass
        if value == "(":
            inner = self._expression(0)
            self._expect(")")
            return inner
        if value in ("-", "+"):
            operand = self._expression(_PREFIX_POWER)
            return -operand if value == "-" else operand
        raise ExpressionError(f"unexpected {value!r}")

    def _call(self, name: str) -> Fraction:
        fn = _FUNCTIONS.get(name.lower())
        if fn is None:
            known = ", ".join(sorted(_FUNCTIONS))
            raise ExpressionError(f"unknown name {name!r} (functions: {known})")
        self._expect("(")
        args: list[Fraction] = []
        if self._peek() != ("op", ")"):
            args.append(self._expression(0))
            while self._peek() == ("op", ","):
                self._pos += 1
                args.append(self._expression(0))
        self._expect(")")
        return _check_size(fn(args))


def evaluate(expression: str) -> Fraction:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Model-written text such as ``"3 * 42.17"`` or ``"round(42.17 / 13.05, 2)"``.

    Returns:
        The exact rational value.

    Raises:
        ExpressionError: The expression is malformed, too long, too deep, divides by zero or would
            produce a number too large to represent.
    """
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise ExpressionError(f"expression too long (limit {MAX_EXPRESSION_LENGTH} characters)")
    return _Parser(_tokenize(expression)).parse()
