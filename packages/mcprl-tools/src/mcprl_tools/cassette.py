"""Record/replay of tool calls as a JSON-lines cassette.

Line 1 is the catalogue (`{"type": "catalogue", "tools": [...]}`); every later line is one call
(`{"type": "call", "name", "arguments", "episode_id", "result"}`). Replay serves each call from the recorded
results for the same (name, arguments, episode_id), in recorded order, with no server running.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from mcprl_tools.errors import CassetteError
from mcprl_tools.results import ToolResult, ToolSpec


def _key(name: str, arguments: object, episode_id: str | None) -> str:
    return json.dumps([name, arguments, episode_id], sort_keys=True, ensure_ascii=False, default=repr)


def spec_to_json(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "server": spec.server,
        "tool": spec.tool,
        "description": spec.description,
        "input_schema": dict(spec.input_schema),
    }


class CassetteRecorder:
    """Appends every call and its result to a cassette file (flushed per line)."""

    def __init__(self, path: str | Path, tools: Sequence[ToolSpec]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file: IO[str] = self.path.open("w", encoding="utf-8")
        self._write({"type": "catalogue", "tools": [spec_to_json(t) for t in tools]})

    def _write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")
        self._file.flush()

    def record(self, name: str, arguments: object, episode_id: str | None, result: ToolResult) -> None:
        """Append one call."""
        self._write(
            {
                "type": "call",
                "name": name,
                "arguments": arguments,
                "episode_id": episode_id,
                "result": result.to_json(),
            }
        )

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class CassettePlayer:
    """Serves recorded results; raises `CassetteError` for a call the cassette does not hold."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tools: list[ToolSpec] = []
        self._calls: defaultdict[str, deque[ToolResult]] = defaultdict(deque)
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise CassetteError(f"{self.path}: cannot read cassette: {exc}") from exc
        for lineno, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                match record["type"]:
                    case "catalogue":
                        self.tools = [ToolSpec(**t) for t in record["tools"]]
                    case "call":
                        key = _key(record["name"], record["arguments"], record["episode_id"])
                        self._calls[key].append(ToolResult.from_json(record["result"]))
                    case other:
                        raise CassetteError(f"{self.path}:{lineno}: unknown record type {other!r}")
            except (ValueError, KeyError, TypeError) as exc:
                raise CassetteError(f"{self.path}:{lineno}: malformed cassette line: {exc}") from exc

    def play(self, name: str, arguments: object, episode_id: str | None) -> ToolResult:
        """The next recorded result for this exact call."""
        queue = self._calls.get(_key(name, arguments, episode_id))
        if not queue:
            raise CassetteError(
                f"{self.path}: no recorded call {name}({json.dumps(arguments, default=repr)[:200]}) "
                f"for episode {episode_id!r} (or all its recordings were already replayed)"
            )
        return queue.popleft()
