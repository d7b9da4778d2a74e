"""Search MCP server: BM25 (``bm25s``) over the shipped corpus, with ``search`` and ``fetch_document``.

Run it with ``python -m mcprl_servers.search``. Results carry a short snippet (the first
:data:`SNIPPET_CHARS` characters); the full text needs ``fetch_document``.
"""

from __future__ import annotations

from typing import Any, cast

import bm25s
from bm25s.tokenization import Tokenizer
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from mcprl_servers.corpus import load_corpus
from mcprl_servers.results import to_json

__all__ = ["MAX_K", "SNIPPET_CHARS", "SearchIndex", "build_server", "main"]

SNIPPET_CHARS = 100
MAX_K = 20


def _snippet(text: str) -> str:
    if len(text) <= SNIPPET_CHARS:
        return text
    return text[:SNIPPET_CHARS].rsplit(" ", 1)[0] + " ..."


class SearchIndex:
    """A BM25 index over documents ``{"doc_id", "title", "text"}`` (title and text are indexed).

    Args:
        docs: The documents; the shipped corpus when None.
    """

    def __init__(self, docs: list[dict[str, Any]] | None = None) -> None:
        self._docs = docs if docs is not None else load_corpus()
        if not self._docs:
            raise ValueError("cannot index an empty corpus")
        self._by_id = {d["doc_id"]: d for d in self._docs}
        self._tokenizer = Tokenizer(stopwords="en")
        texts = [f"{d['title']}. {d['text']}" for d in self._docs]
        ids = self._tokenizer.tokenize(texts, update_vocab=True, return_as="ids", show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(ids, show_progress=False)

    def search(self, query: str, k: int = 5) -> dict[str, Any]:
        """The ``k`` best-matching documents (only those sharing at least one term with ``query``)."""
        if not query.strip():
            raise ToolError("query must not be empty")
        if not 1 <= k <= MAX_K:
            raise ToolError(f"k must be between 1 and {MAX_K}")
        tokens = self._tokenizer.tokenize([query], update_vocab=False, return_as="ids", show_progress=False)
        n = min(k, len(self._docs))
        # bm25s annotates query_tokens as strings/Tokenized but accepts the token-id lists tokenize() returns.
        query_ids = cast(Any, tokens)
        indices, scores = self._bm25.retrieve(query_ids, k=n, show_progress=False, n_threads=1)
        results = []
        for index, score in zip(indices[0], scores[0], strict=True):
            if float(score) <= 0.0:
                continue
            doc = self._docs[int(index)]
            results.append({"doc_id": doc["doc_id"], "title": doc["title"], "snippet": _snippet(doc["text"])})
        return {"results": results}

    def fetch(self, doc_id: str) -> dict[str, Any]:
        """One document's full text."""
        doc = self._by_id.get(doc_id.strip())
        if doc is None:
            raise ToolError(f"Unknown document '{doc_id}'. Use an id returned by search, e.g. 'doc-0001'.")
        return {"doc_id": doc["doc_id"], "title": doc["title"], "text": doc["text"]}


def build_server(index: SearchIndex | None = None) -> MCPServer:
    """Build the search server.

    Args:
        index: Index to serve; one over the shipped corpus when None.
    """
    engine = index if index is not None else SearchIndex()
    server = MCPServer(
        "search", instructions="Full-text search over news and reference documents.", log_level="WARNING"
    )

    @server.tool(structured_output=False)
    def search(query: str, k: int = 5) -> str:
        """Search documents by keywords; returns ids, titles and short snippets of the best `k` (1-20)."""
        return to_json(engine.search(query, k))

    @server.tool(structured_output=False)
    def fetch_document(doc_id: str) -> str:
        """Fetch the full text of a document by its id (e.g. 'doc-0042')."""
        return to_json(engine.fetch(doc_id))

    return server


def main() -> None:
    """Serve the search index over stdio."""
    build_server().run()


if __name__ == "__main__":
    main()
