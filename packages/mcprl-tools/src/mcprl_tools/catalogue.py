"""The tool catalogue: exposed names (namespaced on collision), schemas, and the pinning hash."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from mcprl_tools.results import ToolSpec


class ListedTool(Protocol):
    """What a server lists for one tool."""

    @property
    def name(self) -> str: ...
    @property
    def description(self) -> str: ...
    @property
    def input_schema(self) -> Mapping[str, Any]: ...


def catalogue_hash(tools: Iterable[ListedTool]) -> str:
    """SHA-256 over the names, descriptions and input schemas, independent of listing order."""
    canon = sorted(
        json.dumps([t.name, t.description, t.input_schema], sort_keys=True, ensure_ascii=False) for t in tools
    )
    return hashlib.sha256("\n".join(canon).encode()).hexdigest()


def build_catalogue(by_server: Mapping[str, Sequence[ListedTool]]) -> list[ToolSpec]:
    """Name every tool: its own name when unique across servers, `server.tool` when names collide."""
    counts = Counter(t.name for tools in by_server.values() for t in tools)
    return [
        ToolSpec(
            name=t.name if counts[t.name] == 1 else f"{server}.{t.name}",
            server=server,
            tool=t.name,
            description=t.description,
            input_schema=dict(t.input_schema),
        )
        for server, tools in by_server.items()
        for t in tools
    ]


def index_catalogue(specs: Iterable[ToolSpec]) -> dict[str, ToolSpec]:
    """Lookup table: exposed names and `server.tool` for every tool (exposed names win on ambiguity)."""
    specs = list(specs)
    index = {s.qualified_name: s for s in specs}
    index.update({s.name: s for s in specs})
    return index
