"""Task families over the finance server (plus calculator and messaging for the multi-step ones).

Answers are computed from the shipped fixture with the calculator's own evaluator, so they equal what an
agent gets by calling the tools.
"""

from __future__ import annotations

import random
from itertools import permutations

from mcprl_servers.calculator import calculate_text
from mcprl_servers.workspace_seed import POST_CHANNELS
from mcprl_tasks.family import Combo, Draft, Family
from mcprl_tasks.schema import numeric_checker, posted_checker
from mcprl_tasks.universe import Universe

__all__ = ["FINANCE_FAMILIES"]

_QUOTE = {
    "short": ("Price of {s}?", "What is the price of {s}?", "{s} price?", "Quote {s}."),
    "natural": (
        "What is the latest share price of {s}?",
        "Look up the current stock price of {s} ({n}).",
        "How much does one share of {n} ({s}) cost right now?",
        "Get me a quote for {s}.",
    ),
}
_MUL = {
    "short": ("Price of {s} times {k}?", "{k} times the price of {s}?", "What is {k} x price of {s}?"),
    "natural": (
        "What would {k} shares of {s} cost at the current price?",
        "Multiply the latest price of {s} by {k}.",
        "What is {k} times the price of {n} ({s})?",
    ),
}
_RATIO = {
    "short": (
        "Price of {a} divided by price of {b}?",
        "Ratio of {a} price to {b} price?",
        "{a} price / {b} price?",
    ),
    "natural": (
        "What is the ratio of {a}'s share price to {b}'s?",
        "How many times the price of {b} is the price of {a}?",
        "Divide the current price of {a} by that of {b}.",
    ),
}
_POST = {
    "short": ("Post the price of {s} to #{c}.", "Send {s} price to #{c}.", "Post {s} price in #{c}."),
    "natural": (
        "Look up {s}'s latest price and post it to the #{c} channel.",
        "Share the current price of {n} ({s}) in #{c}.",
        "Check the price of {s} and let #{c} know.",
    ),
}
_REPORT = (
    "Get the prices of {a} and {b}, compute {a}/{b} rounded to 2 decimals, and post it to #{c}.",
    "Post the price ratio of {a} to {b} (rounded to 2 decimals) in #{c}.",
    "Tell #{c} how many times {b}'s price {a}'s price is, rounded to 2 decimals.",
)
_BY_NAME = (
    "What is the latest share price of {n}?",
    "Find the stock of {n} and tell me its current price.",
    "How much does one share of {n} cost?",
)


def _phrase(templates: tuple[str, ...], rng: random.Random, **values: object) -> str:
    return rng.choice(templates).format(**values)


def _quote(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    (s,) = combo
    assert isinstance(s, str)
    return Draft(
        prompt=_phrase(_QUOTE[u.style], rng, s=s, n=u.name(s)),
        servers=["finance"],
        difficulty="easy",
        answer=calculate_text(u.price_text(s)),
        checker=numeric_checker(),
        min_tool_calls=1,
        params={"symbols": [s]},
    )


def _quote_mul(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    s, k = combo
    assert isinstance(s, str)
    assert isinstance(k, int)
    return Draft(
        prompt=_phrase(_MUL[u.style], rng, s=s, k=k, n=u.name(s)),
        servers=["finance", "calculator"],
        difficulty="easy" if u.style == "short" else "medium",
        answer=calculate_text(f"{k} * {u.price_text(s)}"),
        checker=numeric_checker(),
        min_tool_calls=2,
        params={"symbols": [s], "k": k},
    )


def _quote_ratio(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    a, b = combo
    assert isinstance(a, str)
    assert isinstance(b, str)
    return Draft(
        prompt=_phrase(_RATIO[u.style], rng, a=a, b=b),
        servers=["finance", "calculator"],
        difficulty="medium",
        answer=calculate_text(f"{u.price_text(a)} / {u.price_text(b)}"),
        checker=numeric_checker(rel_tol=1e-4),
        min_tool_calls=3,
        params={"symbols": [a, b]},
    )


def _post_quote(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    s, c = combo
    assert isinstance(s, str)
    assert isinstance(c, str)
    price = calculate_text(u.price_text(s))
    return Draft(
        prompt=_phrase(_POST[u.style], rng, s=s, c=c, n=u.name(s)),
        servers=["finance", "messaging"],
        difficulty="medium",
        answer=price,
        checker=posted_checker(c, price),
        min_tool_calls=2,
        params={"symbols": [s], "channel": c},
    )


def _report_ratio(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    a, b, c = combo
    assert isinstance(a, str)
    assert isinstance(b, str)
    assert isinstance(c, str)
    ratio = calculate_text(f"round({u.price_text(a)} / {u.price_text(b)}, 2)")
    # Half the tasks compute with python, when its float round() agrees with the exact half-up rounding.
    python = rng.random() < 0.5 and f"{round(u.price(a) / u.price(b), 2)!r}" == ratio
    return Draft(
        prompt=_phrase(_REPORT, rng, a=a, b=b, c=c),
        servers=["finance", "python" if python else "calculator", "messaging"],
        difficulty="hard",
        answer=ratio,
        checker=posted_checker(c, ratio),
        min_tool_calls=4,
        params={"symbols": [a, b], "channel": c, "compute": "python" if python else "calculator"},
    )


def _quote_by_name(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    (s,) = combo
    assert isinstance(s, str)
    return Draft(
        prompt=_phrase(_BY_NAME, rng, n=u.name(s)),
        servers=["finance"],
        difficulty="medium",
        answer=calculate_text(u.price_text(s)),
        checker=numeric_checker(),
        min_tool_calls=2,
        params={"symbols": [s], "query": u.name(s)},
    )


def _pairs(u: Universe) -> list[Combo]:
    return [(a, b) for a, b in permutations(u.symbols, 2)]


FINANCE_FAMILIES: tuple[Family, ...] = (
    Family(name="quote", combos=lambda u: [(s,) for s in u.symbols], build=_quote),
    Family(
        name="quote_mul",
        combos=lambda u: [(s, k) for s in u.symbols for k in u.multipliers],
        build=_quote_mul,
    ),
    Family(name="quote_ratio", combos=_pairs, build=_quote_ratio),
    Family(
        name="post_quote",
        combos=lambda u: [(s, c) for s in u.symbols for c in POST_CHANNELS],
        build=_post_quote,
    ),
    Family(
        name="report_ratio",
        combos=lambda u: [(a, b, c) for a, b in permutations(u.symbols, 2) for c in POST_CHANNELS],
        build=_report_ratio,
    ),
    Family(name="quote_by_name", combos=lambda u: [(s,) for s in u.symbols], build=_quote_by_name),
)
