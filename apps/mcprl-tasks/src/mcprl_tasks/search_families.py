"""Task families over the search server: questions whose answer sits in one news document."""

from __future__ import annotations

import functools
import random

from mcprl_servers.corpus import EVENT_KINDS, load_corpus
from mcprl_servers.search import SearchIndex
from mcprl_tasks.family import Combo, Draft, Family
from mcprl_tasks.schema import contains_checker
from mcprl_tasks.universe import Universe

__all__ = ["SEARCH_FAMILIES", "ideal_search_query", "search_index"]

_KEYWORDS = {
    "acquisition": "acquisition",
    "facility": "new facility",
    "cfo": "chief financial officer",
    "partnership": "partnership",
    "product": "launched",
}
_QUESTIONS = {
    "acquisition": (
        "Which company did {n} acquire?",
        "What business did {n} ({s}) complete the acquisition of?",
    ),
    "facility": ("In which city did {n} open a new facility?", "Where is the new facility {n} ({s}) opened?"),
    "cfo": ("Who did {n} appoint as chief financial officer?", "Who is the new CFO of {n} ({s})?"),
    "partnership": ("Which company did {n} announce a partnership with?", "Who is {n}'s new partner?"),
    "product": ("What product did {n} launch?", "What is the name of the new product {n} ({s}) launched?"),
}
assert set(_KEYWORDS) == set(_QUESTIONS) == set(EVENT_KINDS)


@functools.cache
def search_index() -> SearchIndex:
    """The search server's index over the shipped corpus (built once per process)."""
    return SearchIndex()


def ideal_search_query(name: str, kind: str) -> str:
    """The query an ideal agent sends for an event of ``kind`` about company ``name``."""
    return f"{name} {_KEYWORDS[kind]}"


@functools.cache
def _answerable_events() -> dict[str, list[tuple[str, str]]]:
    """symbol → [(doc_id, kind)] of events whose ideal query ranks their document first."""
    out: dict[str, list[tuple[str, str]]] = {}
    docs = {d["doc_id"]: d for d in load_corpus()}
    for doc in docs.values():
        kind = doc["meta"]["kind"]
        if kind not in EVENT_KINDS:
            continue
        symbol = doc["meta"]["symbol"]
        name = doc["text"].split(" — ", 1)[1].split(f" ({symbol})", 1)[0]
        top = search_index().search(ideal_search_query(name, kind), 1)["results"]
        if top and top[0]["doc_id"] == doc["doc_id"]:
            out.setdefault(symbol, []).append((doc["doc_id"], kind))
    return out


def _news_combos(u: Universe) -> list[Combo]:
    events = _answerable_events()
    return [(doc_id,) for s in u.symbols for doc_id, _ in events.get(s, [])]


def _news_fact(combo: Combo, rng: random.Random, u: Universe) -> Draft:
    (doc_id,) = combo
    doc = next(d for d in load_corpus() if d["doc_id"] == doc_id)
    kind, symbol, fact = doc["meta"]["kind"], doc["meta"]["symbol"], doc["meta"]["fact"]
    name = u.name(symbol)
    top = search_index().search(ideal_search_query(name, kind), 1)["results"][0]
    in_snippet = fact in top["snippet"] or fact in top["title"]
    return Draft(
        prompt=rng.choice(_QUESTIONS[kind]).format(n=name, s=symbol),
        servers=["search"],
        difficulty="medium",
        answer=fact,
        checker=contains_checker(),
        min_tool_calls=1 if in_snippet else 2,
        params={"doc_id": doc_id, "query": ideal_search_query(name, kind)},
    )


SEARCH_FAMILIES: tuple[Family, ...] = (Family(name="news_fact", combos=_news_combos, build=_news_fact),)
