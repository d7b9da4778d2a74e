from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcprl_servers.errors import ExpressionError
from mcprl_servers.expression import MAX_EXPRESSION_LENGTH, evaluate, round_half_up


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("0.1 + 0.2", Fraction(3, 10)),
        ("3 * 42.17", Fraction("126.51")),
        ("1 + 2 * 3", Fraction(7)),
        ("(1 + 2) * 3", Fraction(9)),
        ("-2**2", Fraction(-4)),
        ("2**-1", Fraction(1, 2)),
        ("2**3**2", Fraction(512)),
        ("2^10", Fraction(1024)),
        ("7 // 2", Fraction(3)),
        ("-7 // 2", Fraction(-4)),
        ("7 % 3", Fraction(1)),
        ("10 / 4", Fraction(5, 2)),
        ("6 × 7 ÷ 2 − 1", Fraction(20)),
        ("1e3 + .5", Fraction(2001, 2)),
        ("abs(-4.5)", Fraction(9, 2)),
        ("min(3, 1, 2) + max(3, 1, 2)", Fraction(4)),
        ("round(42.17 / 13.05, 2)", Fraction("3.23")),
        ("round(2.5)", Fraction(3)),
        ("round(-2.5)", Fraction(-3)),
        ("ROUND(1.005, 2)", Fraction("1.01")),
        ("  4  ", Fraction(4)),
    ],
)
def test_evaluate_is_exact_with_usual_precedence(expression: str, expected: Fraction) -> None:
    assert evaluate(expression) == expected


def test_sqrt_and_fractional_powers_are_accurate_to_many_digits() -> None:
    assert abs(float(evaluate("sqrt(2)")) - 2**0.5) < 1e-15
    assert abs(float(evaluate("8 ** (1/3)")) - 2.0) < 1e-15


@pytest.mark.parametrize(
    ("expression", "reason"),
    [
        ("1 / 0", "division by zero"),
        ("5 // (2 - 2)", "division by zero"),
        ("1 % 0", "division by zero"),
        ("0 ** -1", "division by zero"),
        ("2 ** 100000", "exponent too large"),
        ("9 ** 9 ** 9", "exponent too large"),
        ("10 ** 9000", "result too large"),
        ("(2 ** 5000) ** 5", "result too large"),
        ("1e9999", "number too large"),
        ("(-8) ** 0.5", "negative"),
        ("sqrt(-1)", "negative"),
        ("", "empty"),
        ("1 +", "unexpected end"),
        ("1 2", "unexpected '2'"),
        ("(1", "unexpected end"),
        ("round(1, 2, 3)", "round takes"),
        ("round(1.5, 0.5)", "digits"),
    ],
)
def test_bad_expressions_raise_a_short_reason(expression: str, reason: str) -> None:
    with pytest.raises(ExpressionError, match=reason):
        evaluate(expression)


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "().__class__.__bases__",
        "open('/etc/passwd')",
        "exec('1')",
        "eval('1')",
        "lambda: 1",
        "[1, 2]",
        "1 if 1 else 2",
        "x = 1",
        "a.b",
        "0x10",
        "1_000",
        "٣ + 1",
    ],
)
def test_python_syntax_beyond_arithmetic_is_rejected(expression: str) -> None:
    with pytest.raises(ExpressionError):
        evaluate(expression)


def test_the_evaluator_never_calls_python_eval_exec_or_compile() -> None:
    import ast
    import inspect

    from mcprl_servers import expression

    tree = ast.parse(inspect.getsource(expression))
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert not called & {"eval", "exec", "compile", "__import__", "getattr"}


def test_overlong_and_deeply_nested_expressions_are_refused() -> None:
    with pytest.raises(ExpressionError, match="too long"):
        evaluate("1+" * MAX_EXPRESSION_LENGTH + "1")
    with pytest.raises(ExpressionError, match="nested too deeply"):
        evaluate("(" * 200 + "1" + ")" * 200)
    with pytest.raises(ExpressionError, match="nested too deeply"):
        evaluate("-" * 300 + "1")


_ints = st.integers(min_value=-(10**6), max_value=10**6)


@given(_ints, _ints, _ints, st.sampled_from(["+", "-", "*"]), st.sampled_from(["+", "-", "*"]))
def test_integer_arithmetic_matches_python(a: int, b: int, c: int, op1: str, op2: str) -> None:
    expression = f"{a} {op1} ({b}) {op2} {c}"
    python = {"+": int.__add__, "-": int.__sub__, "*": int.__mul__}
    multiply_first = op1 in "+-" and op2 == "*"
    expected = python[op1](a, python[op2](b, c)) if multiply_first else python[op2](python[op1](a, b), c)
    assert evaluate(expression) == expected


@given(st.fractions(max_denominator=10**6), st.integers(min_value=0, max_value=8))
def test_round_half_up_is_within_half_a_unit(value: Fraction, places: int) -> None:
    rounded = round_half_up(value, places)
    assert abs(rounded - value) <= Fraction(1, 2 * 10**places)
    assert (rounded * 10**places).denominator == 1
