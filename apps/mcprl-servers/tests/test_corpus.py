from __future__ import annotations

from importlib import resources

from mcprl_servers.corpus import (
    CORPUS_COMPANIES,
    CORPUS_SEED,
    EVENT_KINDS,
    corpus_bytes,
    generate_corpus,
    load_corpus,
)
from mcprl_servers.fixture import load_fixture


def test_shipped_corpus_equals_the_generator_output() -> None:
    shipped = resources.files("mcprl_servers").joinpath("data", "search_corpus.json").read_bytes()
    assert shipped == corpus_bytes(generate_corpus(CORPUS_SEED))


def test_corpus_has_a_few_hundred_documents_with_unique_ids() -> None:
    docs = load_corpus()
    assert 200 <= len(docs) <= 500
    assert len({d["doc_id"] for d in docs}) == len(docs)
    assert all(d["title"] and d["text"] for d in docs)


def test_every_company_has_an_overview_earnings_and_events() -> None:
    docs = load_corpus()
    described = list(load_fixture()["companies"])[:CORPUS_COMPANIES]
    assert {d["meta"]["symbol"] for d in docs if "symbol" in d["meta"]} == set(described)
    for symbol in described:
        kinds = [d["meta"]["kind"] for d in docs if d["meta"].get("symbol") == symbol]
        assert kinds.count("overview") == 1
        assert kinds.count("earnings") == 3
        assert sum(k in EVENT_KINDS for k in kinds) == 2


def test_event_facts_appear_in_the_text() -> None:
    for doc in load_corpus():
        if doc["meta"]["kind"] in EVENT_KINDS:
            assert doc["meta"]["fact"] in doc["text"]
            assert doc["meta"]["fact"] not in doc["title"]
