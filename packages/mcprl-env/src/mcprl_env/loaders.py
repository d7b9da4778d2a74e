"""Streaming task-set loaders for JSON arrays and JSON lines.

A task file is read a chunk at a time and never held in memory: a JSON array is decoded item by item with
`json.JSONDecoder.raw_decode` over a sliding buffer, JSON lines line by line. Shuffling uses either a bounded
buffer or an index of byte offsets (8 bytes per task) that gives exact, resumable per-epoch permutations.
Every validation error names the file, the line where the item starts, the item index and the field. A
``python`` checker's file is found relative to the task file's directory.
"""

from __future__ import annotations

import codecs
import json
import random
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Literal

import attrs

from mcprl_env.errors import TaskValidationError
from mcprl_env.tasks import Checker, Task, task_from_dict

__all__ = ["TaskFormat", "TaskSet", "iter_tasks"]

TaskFormat = Literal["auto", "json", "jsonl"]

_CHUNK = 1 << 16
_WS = " \t\r\n"
# Where JSONDecodeError points when the input merely stopped early: the end of the buffer, the start of a
# cut literal ("tru"), number or escape (all within a few chars of the end), or the start of a cut string.
_CUT_MARGIN = 10
_DECODER = json.JSONDecoder()


@attrs.frozen
class _RawItem:
    value: object
    index: int
    line: int
    offset: int


class _Reader:
    """A decoded sliding window over a binary file that tracks byte offsets and line numbers."""

    def __init__(
        self, fh: BinaryIO, source: str, *, offset: int = 0, line: int = 1, max_item_chars: int
    ) -> None:
        self._fh = fh
        self._source = source
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._max = max_item_chars
        self.buf = ""
        self.pos = 0
        self.eof = False
        self.offset = offset  # byte offset of buf[pos]
        self.line = line  # line number of buf[pos]

    def fill(self, size: int = _CHUNK) -> bool:
        if self.eof:
            return False
        data = self._fh.read(size)
        try:
            text = self._decoder.decode(data, final=not data)
        except UnicodeDecodeError as exc:
            raise TaskValidationError(
                f"not UTF-8 ({exc.reason})", source=self._source, line=self.line
            ) from None
        if not data:
            self.eof = True
        self.buf = self.buf[self.pos :] + text
        self.pos = 0
        return bool(data) or bool(text)

    def advance(self, n: int) -> None:
        consumed = self.buf[self.pos : self.pos + n]
        self.offset += len(consumed.encode("utf-8", "surrogatepass"))
        self.line += consumed.count("\n")
        self.pos += n

    def skip_ws(self) -> str | None:
        """Skip whitespace; the next character (not consumed), or None at end of file."""
        while True:
            while self.pos < len(self.buf) and self.buf[self.pos] in _WS:
                self.advance(1)
            if self.pos < len(self.buf):
                return self.buf[self.pos]
            if not self.fill():
                return None

    def error(self, reason: str, index: int | None = None) -> TaskValidationError:
        return TaskValidationError(reason, source=self._source, line=self.line, index=index)

    def decode_value(self, index: int | None) -> object:
        decoder = _DECODER
        size = _CHUNK
        while True:
            try:
                value, end = decoder.raw_decode(self.buf, self.pos)
            except json.JSONDecodeError as exc:
                cut = exc.pos >= len(self.buf) - _CUT_MARGIN or exc.msg.startswith("Unterminated string")
                if not cut or self.eof:
                    line = self.line + self.buf.count("\n", self.pos, exc.pos)
                    raise TaskValidationError(
                        f"invalid JSON: {exc.msg}", source=self._source, line=line, index=index
                    ) from None
                if len(self.buf) - self.pos > self._max:
                    raise self.error(f"item longer than {self._max} characters", index) from None
                self.fill(size)
                size = min(size * 2, 1 << 24)
                continue
            except RecursionError:
                raise self.error("invalid JSON: nested too deeply", index) from None
            if end == len(self.buf) and not self.eof and isinstance(value, int | float):
                self.fill(size)  # a number may continue in the next chunk
                continue
            self.advance(end - self.pos)
            return value


def _iter_array(fh: BinaryIO, source: str, max_item_chars: int) -> Iterator[_RawItem]:
    reader = _Reader(fh, source, max_item_chars=max_item_chars)
    reader.fill()
    if reader.buf.startswith("\ufeff"):
        reader.advance(1)
    if reader.skip_ws() != "[":
        raise reader.error("a JSON task file must be an array of task objects (or use JSON lines)")
    reader.advance(1)
    index = 0
    while True:
        char = reader.skip_ws()
        if char is None:
            raise reader.error("unexpected end of file inside the task array", index)
        if char == "]" and index == 0:
            reader.advance(1)
            break
        line, offset = reader.line, reader.offset
        value = reader.decode_value(index)
        yield _RawItem(value, index, line, offset)
        index += 1
        char = reader.skip_ws()
        if char == ",":
            reader.advance(1)
        elif char == "]":
            reader.advance(1)
            break
        elif char is None:
            raise reader.error("unexpected end of file inside the task array", index - 1)
        else:
            raise reader.error(f"expected ',' or ']' after item, got {char!r}", index - 1)
    if reader.skip_ws() is not None:
        raise reader.error("text after the end of the task array")


def _iter_lines(fh: BinaryIO, source: str, max_item_chars: int) -> Iterator[_RawItem]:
    offset, index = 0, 0
    for line_no, raw in enumerate(iter(lambda: fh.readline(max_item_chars * 4 + 1), b""), start=1):
        if len(raw) > max_item_chars * 4 and not raw.endswith(b"\n"):
            raise TaskValidationError(
                f"line longer than {max_item_chars * 4} bytes", source=source, line=line_no, index=index
            )
        start = offset
        offset += len(raw)
        try:
            text = raw.decode("utf-8-sig" if start == 0 else "utf-8").strip()
        except UnicodeDecodeError as exc:
            raise TaskValidationError(
                f"not UTF-8 ({exc.reason})", source=source, line=line_no, index=index
            ) from None
        if not text:
            continue
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
            raise TaskValidationError(
                f"invalid JSON: {reason}", source=source, line=line_no, index=index
            ) from None
        yield _RawItem(value, index, line_no, start)
        index += 1


def _validated(item: _RawItem, source: str, default_checker: Checker | None) -> Task:
    try:
        return task_from_dict(item.value, base_dir=Path(source).parent, default_checker=default_checker)
    except TaskValidationError as exc:
        raise exc.located(source=source, line=item.line, index=item.index) from None


@attrs.define
class _Index:
    offsets: array[int]
    lines: array[int]


class TaskSet:
    """A task file read as a stream.

    Args:
        path: A ``.json`` file holding an array of tasks, or JSON lines (``.jsonl``; also detected by content).
        format: ``"auto"`` (by the first non-blank character), ``"json"`` or ``"jsonl"``.
        max_item_chars: Longest accepted task object.
        default_checker: The checker of a task without a ``checker`` key (None: ``exact``).
    """

    def __init__(
        self,
        path: str | Path,
        *,
        format: TaskFormat = "auto",
        max_item_chars: int = 1 << 22,
        default_checker: Checker | None = None,
    ) -> None:
        self.path = Path(path)
        self.max_item_chars = max_item_chars
        self.default_checker = default_checker
        self.format: Literal["json", "jsonl"] = self._detect() if format == "auto" else format
        self._index: _Index | None = None

    def _detect(self) -> Literal["json", "jsonl"]:
        with self.path.open("rb") as fh:
            head = fh.read(_CHUNK).lstrip(b"\xef\xbb\xbf").lstrip()
            while not head:
                chunk = fh.read(_CHUNK)
                if not chunk:
                    return "jsonl"
                head = chunk.lstrip()
        return "json" if head.startswith(b"[") else "jsonl"

    def _raw(self, fh: BinaryIO) -> Iterator[_RawItem]:
        match self.format:
            case "json":
                return _iter_array(fh, str(self.path), self.max_item_chars)
            case "jsonl":
                return _iter_lines(fh, str(self.path), self.max_item_chars)

    def __iter__(self) -> Iterator[Task]:
        """Tasks in file order, validated one at a time."""
        with self.path.open("rb") as fh:
            for item in self._raw(fh):
                yield _validated(item, str(self.path), self.default_checker)

    def build_index(self) -> int:
        """Validate every task once and record where each starts; returns the number of tasks.

        Raises:
            TaskValidationError: a task does not match the schema, or two tasks share an id (episode ids, and
                the episodes' state on stateful servers, derive from it); the error names both lines.
        """
        offsets, lines = array("q"), array("q")
        first: dict[str, tuple[int, int]] = {}
        with self.path.open("rb") as fh:
            for item in self._raw(fh):
                task = _validated(item, str(self.path), self.default_checker)
                index, line = first.setdefault(task.id, (item.index, item.line))
                if index != item.index:
                    raise TaskValidationError(
                        f"duplicate task id {task.id!r} (first at line {line}, item {index})",
                        source=str(self.path),
                        line=item.line,
                        index=item.index,
                        field="id",
                    )
                offsets.append(item.offset)
                lines.append(item.line)
        self._index = _Index(offsets, lines)
        return len(offsets)

    def _require_index(self) -> _Index:
        if self._index is None:
            self.build_index()
        assert self._index is not None
        return self._index

    def __len__(self) -> int:
        return len(self._require_index().offsets)

    def task_at(self, index: int) -> Task:
        """The task at position ``index`` (random access through the offset index)."""
        idx = self._require_index()
        offset, line = idx.offsets[index], idx.lines[index]
        with self.path.open("rb") as fh:
            fh.seek(offset)
            reader = _Reader(fh, str(self.path), offset=offset, line=line, max_item_chars=self.max_item_chars)
            reader.fill()
            if reader.buf.startswith("\ufeff"):
                reader.advance(1)
            value = reader.decode_value(index)
        return _validated(_RawItem(value, index, line, offset), str(self.path), self.default_checker)

    def epoch_order(self, epoch: int, *, seed: int) -> array[int]:
        """The permutation of task positions used in ``epoch`` (deterministic in ``seed`` and ``epoch``)."""
        order = array("q", range(len(self)))
        rng = random.Random(f"{seed}:{epoch}")
        for i in range(len(order) - 1, 0, -1):
            j = rng.randrange(i + 1)
            order[i], order[j] = order[j], order[i]
        return order

    def iter_epoch(self, epoch: int, *, seed: int, start: int = 0) -> Iterator[tuple[int, Task]]:
        """``(position_in_epoch, task)`` in the epoch's shuffled order, resuming at ``start``."""
        order = self.epoch_order(epoch, seed=seed)
        for position in range(start, len(order)):
            yield position, self.task_at(order[position])

    def shuffled(self, *, seed: int, buffer_size: int = 10_000) -> Iterator[Task]:
        """Tasks in an approximately shuffled order, holding at most ``buffer_size`` tasks."""
        if buffer_size < 1:
            raise ValueError("buffer_size must be >= 1")
        rng = random.Random(seed)
        buffer: list[Task] = []
        for task in self:
            if len(buffer) < buffer_size:
                buffer.append(task)
                continue
            j = rng.randrange(buffer_size)
            yield buffer[j]
            buffer[j] = task
        rng.shuffle(buffer)
        yield from buffer


def iter_tasks(
    path: str | Path, *, format: TaskFormat = "auto", default_checker: Checker | None = None
) -> Iterator[Task]:
    """Stream the tasks of a JSON or JSONL file (see `TaskSet`)."""
    return iter(TaskSet(path, format=format, default_checker=default_checker))
