from __future__ import annotations

import json
import sys

import anyio
import pytest
from mcp import Client, StdioServerParameters
from mcp.types import CallToolResult, TextContent

from mcprl_servers.corpus import EVENT_KINDS, load_corpus
from mcprl_servers.search import MAX_K, SNIPPET_CHARS, SearchIndex, build_server

pytestmark = pytest.mark.anyio

_INDEX = SearchIndex()


def _text(result: CallToolResult) -> str:
    (content,) = result.content
    assert isinstance(content, TextContent)
    return content.text


async def test_search_returns_ids_titles_and_short_snippets() -> None:
    async with Client(build_server(_INDEX)) as client:
        result = json.loads(_text(await client.call_tool("search", {"query": "free cash flow", "k": 3})))
        assert 1 <= len(result["results"]) <= 3
        top = result["results"][0]
        assert top["title"] == "Free cash flow"
        assert set(top) == {"doc_id", "title", "snippet"}
        assert all(len(r["snippet"]) <= SNIPPET_CHARS + 4 for r in result["results"])


async def test_fetch_document_returns_the_full_text() -> None:
    doc = load_corpus()[0]
    async with Client(build_server(_INDEX)) as client:
        fetched = json.loads(_text(await client.call_tool("fetch_document", {"doc_id": doc["doc_id"]})))
        assert fetched == {"doc_id": doc["doc_id"], "title": doc["title"], "text": doc["text"]}


@pytest.mark.parametrize(
    ("tool", "arguments", "reason"),
    [
        ("search", {"query": "  "}, "must not be empty"),
        ("search", {"query": "energy", "k": 0}, "k must be between"),
        ("search", {"query": "energy", "k": MAX_K + 1}, "k must be between"),
        ("fetch_document", {"doc_id": "doc-9999"}, "Unknown document 'doc-9999'"),
    ],
)
async def test_bad_requests_are_tool_errors(tool: str, arguments: dict[str, object], reason: str) -> None:
    async with Client(build_server(_INDEX)) as client:
        result = await client.call_tool(tool, arguments)
        assert result.is_error
        assert reason in _text(result)


def test_queries_without_known_terms_return_nothing() -> None:
    assert _INDEX.search("zzzzqx", 5) == {"results": []}
    assert _INDEX.search("the of and", 5) == {"results": []}


def test_company_event_queries_rank_the_event_document_first() -> None:
    keywords = {
        "acquisition": "acquisition",
        "facility": "new facility",
        "cfo": "chief financial officer",
        "partnership": "partnership",
        "product": "launched",
    }
    events = [d for d in load_corpus() if d["meta"]["kind"] in EVENT_KINDS]
    hits = 0
    for doc in events:
        name = doc["title"].split(" ")[0]
        query = f"{doc['text'].split(' — ')[1].split(' (')[0]} {keywords[doc['meta']['kind']]}"
        assert name in query
        hits += _INDEX.search(query, 1)["results"][0]["doc_id"] == doc["doc_id"]
    assert hits / len(events) >= 0.9


def test_each_glossary_title_finds_its_own_entry() -> None:
    glossary = [d for d in load_corpus() if d["meta"]["kind"] == "glossary"]
    for doc in glossary:
        ids = [r["doc_id"] for r in _INDEX.search(doc["title"], 3)["results"]]
        assert doc["doc_id"] in ids, doc["title"]


async def test_search_runs_as_a_stdio_server() -> None:
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcprl_servers.search"])
    with anyio.fail_after(60):
        async with Client(params) as client:
            result = json.loads(_text(await client.call_tool("search", {"query": "dividend yield"})))
            assert result["results"][0]["title"] == "Dividend yield"
