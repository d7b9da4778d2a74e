"""Record/replay of tool calls as a JSON-lines cassette, replayable by a different run.

Format (version 2). Line 1 is the header::

    {"type": "catalogue", "version": 2, "tools": [...], "servers": {"<server>": {"stateful": bool}}}

and every later line one call that reached a server (local rejections — an unknown tool, arguments that fail
the schema — are recomputed on replay from the catalogue, so they are never recorded)::

    {"type": "call", "server", "tool", "arguments", "history", "episode_id", "result"}

**Keys.** A stateless server's answer depends on the call alone, so its calls are keyed by
(server, tool, arguments) with the arguments as canonical JSON (sorted keys): any run that makes the same call
gets the recorded answer, whatever its episode ids, step numbers or concurrency. A stateful server keeps state
per episode, built by the episode's own earlier calls to it; its answer depends on those too, so its calls are
keyed by (server, tool, arguments, history), where history is a digest of the episode's earlier calls to that
server (tool and arguments, in the order they were sent). A different run replays a stateful call when its
episode reached the same state by the same calls; an episode that took another path misses instead of being
served an answer from a state it never built. Both keys assume a server answers the same call in the same
state the same way; a server whose answers depend on anything else (the clock, randomness, the episode id
itself) replays only approximately, and should be recorded again.

**Order.** A key recorded several times serves its results in recorded order; asked more often than recorded,
it repeats the last one (the server is deterministic for that key, so another call would have answered alike).

**Misses.** A call the cassette does not hold is counted (`take_counts`), appended to the JSON-lines miss
report when one is given, and answered with an infrastructure error result (`error_type="replay_miss"`,
`CassettePlayer.serve`), so the episode is invalid and never scored as the model's failure. Once an episode
missed a stateful call, its later calls to that server miss too: the state after the unanswered call is
unknown.

Cassettes of version 1 (keyed by episode id, no version field) are refused with the file and line.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs
import structlog

from mcprl_tools.catalogue import build_catalogue
from mcprl_tools.config import ServerConfig
from mcprl_tools.errors import CassetteError
from mcprl_tools.results import ToolResult, ToolSpec

logger = structlog.get_logger()

FORMAT_VERSION = 2
_ARGUMENTS_HEAD = 300


def canonical_json(value: object) -> str:
    """The canonical JSON of a call's arguments: sorted keys, no spaces, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=repr)


def call_key(server: str, tool: str, arguments: object, history: str | None) -> str:
    """The cassette key of one call; `history` is None for a stateless server."""
    return canonical_json([server, tool, arguments, history])


class EpisodeHistories:
    """Per (episode, server): a digest of the calls the episode has sent to that server so far.

    The digest is a hash chain (`sha256(previous + call)`), so it costs the same however long the episode.
    """

    def __init__(self) -> None:
        self._digests: dict[tuple[str | None, str], tuple[int, str]] = {}

    def advance(self, episode_id: str | None, server: str, tool: str, arguments: object) -> tuple[int, str]:
        """`(count, digest)` of the episode's earlier calls to `server`, then adds this call to them."""
        count, digest = self._digests.get((episode_id, server), (0, ""))
        step = hashlib.sha256(f"{digest}\n{canonical_json([tool, arguments])}".encode()).hexdigest()
        self._digests[(episode_id, server)] = (count + 1, step)
        return count, digest


@attrs.frozen
class _Listed:
    """A recorded tool as its server listed it (`mcprl_tools.catalogue.ListedTool`)."""

    name: str
    description: str
    input_schema: Mapping[str, Any]


def spec_to_json(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "server": spec.server,
        "tool": spec.tool,
        "description": spec.description,
        "input_schema": dict(spec.input_schema),
    }


class CassetteRecorder:
    """Appends every call that reached a server, and its result, to a cassette file (flushed per line).

    An existing cassette with the same catalogue is appended to (a resumed run, or several runs pooling their
    calls: the keys hold across runs); one with another catalogue is refused.

    Args:
        path: The cassette to write.
        tools: The catalogue.
        stateful: Per server, whether it keeps per-episode state (`ServerConfig.stateful`).

    Raises:
        CassetteError: `path` holds a cassette of another catalogue or format.
    """

    def __init__(self, path: str | Path, tools: Sequence[ToolSpec], stateful: Mapping[str, bool]) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.calls = 0
        servers = {name: {"stateful": flag} for name, flag in sorted(stateful.items())}
        header = {
            "type": "catalogue",
            "version": FORMAT_VERSION,
            "tools": [spec_to_json(t) for t in tools],
            "servers": servers,
        }
        existing = self._existing_header()
        if existing is not None and existing != json.loads(json.dumps(header, default=repr)):
            raise CassetteError(
                f"{self.path}:1: holds a cassette of another tool catalogue or format; record to a new path"
            )
        self._file: IO[str] = self.path.open("a", encoding="utf-8")
        if existing is None:
            self._write(header)

    def _existing_header(self) -> object | None:
        try:
            with self.path.open(encoding="utf-8") as file:
                first = file.readline()
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError) as exc:
            raise CassetteError(f"{self.path}: cannot read the existing cassette: {exc}") from exc
        if not first.strip():
            return None
        try:
            return json.loads(first)
        except ValueError as exc:
            raise CassetteError(f"{self.path}:1: the existing file is not a cassette: {exc}") from exc

    def _write(self, record: Mapping[str, Any]) -> None:
        self._file.write(json.dumps(record, ensure_ascii=False, default=repr) + "\n")
        self._file.flush()

    def record(
        self,
        spec: ToolSpec,
        arguments: object,
        history: str | None,
        episode_id: str | None,
        result: ToolResult,
    ) -> None:
        """Append one call; `history` as given by `EpisodeHistories.advance` (None: stateless server)."""
        self.calls += 1
        self._write(
            {
                "type": "call",
                "server": spec.server,
                "tool": spec.tool,
                "arguments": arguments,
                "history": history,
                "episode_id": episode_id,
                "result": result.to_json(),
            }
        )

    def close(self) -> None:
        """Close the file."""
        self._file.close()


class CassettePlayer:
    """Serves recorded results by key (see the module docstring).

    Args:
        path: The cassette to read.
        miss_report: Append one JSON line per miss here (created on the first miss).

    Raises:
        CassetteError: The file cannot be read, is not a version-2 cassette, or a line is malformed (the
            message names the file and line).
    """

    def __init__(self, path: str | Path, *, miss_report: str | Path | None = None) -> None:
        self.path = Path(path)
        self.miss_report = Path(miss_report) if miss_report is not None else None
        self.tools: list[ToolSpec] = []
        self.stateful: dict[str, bool] = {}
        self.hits = 0
        self.misses = 0
        self._taken = (0, 0)
        self._calls: defaultdict[str, list[ToolResult]] = defaultdict(list)
        self._served: defaultdict[str, int] = defaultdict(int)
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CassetteError(f"{self.path}: cannot read cassette: {exc}") from exc
        if not lines:
            raise CassetteError(f"{self.path}:1: empty cassette (expected a catalogue line)")
        for lineno, line in enumerate(lines, start=1):
            if line.strip():
                self._read_line(lineno, line)

    def _read_line(self, lineno: int, line: str) -> None:
        where = f"{self.path}:{lineno}"
        try:
            record = json.loads(line)
            match record["type"]:
                case "catalogue" if lineno == 1:
                    version = record.get("version", 1)
                    if version != FORMAT_VERSION:
                        raise CassetteError(
                            f"{where}: cassette format version {version} (keyed by episode id) is not "
                            f"replayable by this version (format {FORMAT_VERSION}); record it again"
                        )
                    self.tools = [ToolSpec(**t) for t in record["tools"]]
                    self.stateful = {s: bool(v["stateful"]) for s, v in record["servers"].items()}
                case "catalogue":
                    raise CassetteError(f"{where}: a second catalogue line (only line 1 holds it)")
                case "call" if lineno > 1:
                    key = call_key(record["server"], record["tool"], record["arguments"], record["history"])
                    self._calls[key].append(ToolResult.from_json(record["result"]))
                case "call":
                    raise CassetteError(f"{where}: expected the catalogue line first")
                case other:
                    raise CassetteError(f"{where}: unknown record type {other!r}")
        except CassetteError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CassetteError(f"{where}: malformed cassette line: {type(exc).__name__}: {exc}") from exc

    def catalogue(self, servers: Mapping[str, ServerConfig]) -> list[ToolSpec]:
        """The recorded tools of `servers` under their allow/deny lists, named as a live run of them names
        them; every recorded tool when `servers` is empty (`ToolManager.replay`)."""
        if not servers:
            return list(self.tools)
        absent = sorted(set(servers) - {t.server for t in self.tools})
        if absent:
            logger.warning("cassette_lacks_servers", cassette=str(self.path), servers=absent)
        by_server: dict[str, list[_Listed]] = {}
        for t in self.tools:
            if t.server in servers and servers[t.server].exposes(t.tool):
                by_server.setdefault(t.server, []).append(_Listed(t.tool, t.description, t.input_schema))
        return build_catalogue(by_server)

    def serve(
        self,
        name: str,
        spec: ToolSpec,
        arguments: object,
        history: str | None,
        episode_id: str | None,
        earlier: int,
    ) -> ToolResult:
        """The recorded result of a call that passed the local checks, or a `replay_miss` infra error.

        Args:
            name: The name the tool was called by.
            spec: The tool.
            arguments: The normalised arguments.
            history: The episode's history digest for a stateful server, None for a stateless one.
            episode_id: The calling episode (for the miss report).
            earlier: How many calls the episode made to the server before this one (for the miss report).
        """
        recorded = self.play(spec.server, spec.tool, arguments, history)
        if recorded is not None:
            # The cassette is one session of each server: results recorded across a restart must not look
            # like a restart under the replayed episode; and a replayed call waits in no server's queue.
            generation = 1 if recorded.generation is not None else None
            return attrs.evolve(recorded, name=name, generation=generation, queue_s=0.0)
        self.report_miss(spec.server, spec.tool, arguments, episode_id, earlier)
        after = f" after this episode's {earlier} earlier call(s) to {spec.server!r}" if history else ""
        return ToolResult(
            kind="infra_error",
            text=f"Tool {name} not replayable: cassette {self.path} holds no such call{after}",
            name=name,
            server=spec.server,
            error_type="replay_miss",
        )

    def log_summary(self) -> None:
        """One line for the end of a run: hits, misses and where the misses are listed."""
        log = logger.warning if self.misses else logger.info
        report = str(self.miss_report) if self.miss_report is not None else None
        log("cassette_replayed", cassette=str(self.path), hits=self.hits, misses=self.misses, report=report)

    def play(self, server: str, tool: str, arguments: object, history: str | None) -> ToolResult | None:
        """The next recorded result for this key (the last repeating), or None for a miss (not yet counted)."""
        key = call_key(server, tool, arguments, history)
        results = self._calls.get(key)
        if not results:
            return None
        index = min(self._served[key], len(results) - 1)
        self._served[key] += 1
        self.hits += 1
        return results[index]

    def report_miss(
        self, server: str, tool: str, arguments: object, episode_id: str | None, earlier: int
    ) -> None:
        """Count one miss and append it to the miss report (tool, arguments head, episode, earlier calls)."""
        self.misses += 1
        if self.miss_report is None:
            return
        self.miss_report.parent.mkdir(parents=True, exist_ok=True)
        record = {
            "tool": f"{server}.{tool}",
            "arguments": canonical_json(arguments)[:_ARGUMENTS_HEAD],
            "episode_id": episode_id,
            "earlier_calls_to_server": earlier,
            "cassette": str(self.path),
        }
        with self.miss_report.open("a", encoding="utf-8") as file:
            file.write(json.dumps(record, ensure_ascii=False) + "\n")

    def take_counts(self) -> dict[str, float]:
        """`tools/replay/hits` and `tools/replay/misses` since the previous call."""
        hits, misses = self._taken
        self._taken = (self.hits, self.misses)
        return {
            "tools/replay/hits": float(self.hits - hits),
            "tools/replay/misses": float(self.misses - misses),
        }
