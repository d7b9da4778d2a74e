"""Streaming task loaders: formats, located errors, bounded memory, shuffling."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mcprl_env.loaders as loaders
from mcprl_env import TaskSet, TaskValidationError, iter_tasks


def raw_task(i: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"t{i:06d}",
        "prompt": f"What is {i} times 2? ünï",
        "answer": str(2 * i),
        "checker": {"type": "numeric"},
        "servers": ["calculator"],
        "difficulty": "easy",
        **extra,
    }


def write_array(path: Path, tasks: list[Any], *, indent: int | None = 2) -> Path:
    path.write_text(json.dumps(tasks, indent=indent, ensure_ascii=False), encoding="utf-8")
    return path


def write_lines(path: Path, tasks: list[Any]) -> Path:
    path.write_text("".join(json.dumps(t, ensure_ascii=False) + "\n" for t in tasks), encoding="utf-8")
    return path


def test_json_array_and_json_lines_give_the_same_tasks(tmp_path: Path) -> None:
    tasks = [raw_task(i) for i in range(30)]
    a = list(iter_tasks(write_array(tmp_path / "a.json", tasks)))
    b = list(iter_tasks(write_lines(tmp_path / "b.jsonl", tasks)))
    assert a == b
    assert [t.id for t in a] == [f"t{i:06d}" for i in range(30)]
    assert TaskSet(tmp_path / "a.json").format == "json"
    assert TaskSet(tmp_path / "b.jsonl").format == "jsonl"


def test_json_lines_in_a_json_file_and_blank_lines_are_accepted(tmp_path: Path) -> None:
    path = tmp_path / "lines.json"
    path.write_text("\n" + json.dumps(raw_task(1)) + "\n\n" + json.dumps(raw_task(2)) + "\n")
    assert [t.id for t in iter_tasks(path)] == ["t000001", "t000002"]


def test_empty_array_is_an_empty_task_set(tmp_path: Path) -> None:
    assert list(iter_tasks(write_array(tmp_path / "e.json", []))) == []


def test_validation_error_names_file_line_item_and_field(tmp_path: Path) -> None:
    tasks = [raw_task(0), raw_task(1), {**raw_task(2), "difficulty": "insane"}]
    path = write_array(tmp_path / "bad.json", tasks)
    with pytest.raises(TaskValidationError) as info:
        list(iter_tasks(path))
    err = info.value
    lines = path.read_text().splitlines()
    assert (err.source, err.index, err.field) == (str(path), 2, "difficulty")
    assert err.line is not None
    assert lines[err.line - 1].strip() == "{"
    assert lines[err.line].strip() == '"id": "t000002",'
    assert f"{path}:{err.line} (item 2): field 'difficulty'" in str(err)


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(raw_task(0)) + "\n\n" + '{"id": "x", "prompt": 1}\n')
    with pytest.raises(TaskValidationError) as info:
        list(iter_tasks(path))
    assert (info.value.line, info.value.index, info.value.field) == (3, 1, "prompt")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ('[{"id": "a", "prompt": "p", "answer": "1"},\n{"id": "b" "prompt": "p"}]', "invalid JSON"),
        ('[{"id": "a", "prompt": "p", "answer": "1"}', "unexpected end"),
        ('[{"id": "a", "prompt": "p", "answer": "1"}] extra', "after the end"),
        ('{"not": "an array"} {"x": 1}', "invalid JSON"),
        ('[{"id": "a", "prompt": "p", "answer": "1"} {"id": "b"}]', "expected ','"),
        ('[{"id": "a", "prompt": "unterminated}]', "invalid JSON"),
    ],
)
def test_malformed_files_raise_located_errors(tmp_path: Path, text: str, reason: str) -> None:
    path = tmp_path / "m.json"
    path.write_text(text)
    with pytest.raises(TaskValidationError, match=reason) as info:
        list(iter_tasks(path))
    assert info.value.source == str(path)
    assert info.value.line is not None


def test_invalid_utf8_is_a_located_error(tmp_path: Path) -> None:
    path = tmp_path / "b.jsonl"
    path.write_bytes(json.dumps(raw_task(0)).encode() + b"\n" + b'{"id": "\xff"}\n')
    with pytest.raises(TaskValidationError, match="UTF-8") as info:
        list(iter_tasks(path))
    assert info.value.line == 2


@settings(max_examples=40, deadline=None)
@given(chunk=st.integers(min_value=1, max_value=64), indent=st.sampled_from([None, 0, 2]))
def test_array_decoding_is_independent_of_chunk_boundaries(
    tmp_path_factory: pytest.TempPathFactory, chunk: int, indent: int | None
) -> None:
    tasks = [raw_task(i, metadata={"n": i * 1.5, "big": 10**i}) for i in range(8)]
    path = write_array(tmp_path_factory.mktemp("c") / "c.json", tasks, indent=indent)
    old = loaders._CHUNK
    loaders._CHUNK = chunk
    try:
        got = TaskSet(path)
        assert [t.to_dict()["metadata"] for t in got] == [t["metadata"] for t in tasks]
        assert [got.task_at(i).id for i in (7, 0, 3)] == ["t000007", "t000000", "t000003"]
    finally:
        loaders._CHUNK = old


def test_random_access_and_epoch_order_are_deterministic_permutations(tmp_path: Path) -> None:
    ts = TaskSet(write_array(tmp_path / "a.json", [raw_task(i) for i in range(200)]))
    assert len(ts) == 200
    assert ts.task_at(123).id == "t000123"
    e0 = [t.id for _, t in ts.iter_epoch(0, seed=7)]
    assert sorted(e0) == [f"t{i:06d}" for i in range(200)]
    assert e0 != sorted(e0)
    assert e0 == [t.id for _, t in ts.iter_epoch(0, seed=7)]
    assert e0 != [t.id for _, t in ts.iter_epoch(1, seed=7)]
    resumed = [(p, t.id) for p, t in ts.iter_epoch(0, seed=7, start=150)]
    assert resumed == list(enumerate(e0))[150:]


def test_bounded_shuffle_buffer_yields_every_task_once(tmp_path: Path) -> None:
    ts = TaskSet(write_lines(tmp_path / "a.jsonl", [raw_task(i) for i in range(500)]))
    order = [t.id for t in ts.shuffled(seed=3, buffer_size=50)]
    assert sorted(order) == [f"t{i:06d}" for i in range(500)]
    assert order != sorted(order)
    assert order == [t.id for t in ts.shuffled(seed=3, buffer_size=50)]


@pytest.mark.slow
@pytest.mark.parametrize(("form", "count"), [("json", 100_000), ("jsonl", 20_000)])
def test_streaming_100k_tasks_keeps_memory_far_below_the_file_size(
    tmp_path: Path, form: str, count: int
) -> None:
    """The JSON array (the harder case: one value spanning the file) at 100k; JSON lines are read line by line."""
    path = tmp_path / f"big.{form}"
    with path.open("w", encoding="utf-8") as fh:
        if form == "json":
            fh.write("[\n")
        for i in range(count):
            sep = ",\n" if form == "json" and i < count - 1 else "\n"
            fh.write(json.dumps(raw_task(i, metadata={"family": "mul", "pad": "x" * 100})) + sep)
        if form == "json":
            fh.write("]\n")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        seen = sum(1 for _ in iter_tasks(path))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == count
    assert size > count * 250
    assert peak < 2_000_000, f"peak {peak} bytes while streaming a {size}-byte file"


def test_duplicate_task_ids_are_refused_with_both_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    rows = [{"id": "a", "prompt": "p", "answer": "1"}, {"id": "b", "prompt": "p", "answer": "2"}]
    rows.append({"id": "a", "prompt": "q", "answer": "3"})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        TaskValidationError,
        match=r"tasks.jsonl:3 \(item 2\): field 'id': duplicate task id 'a' \(first at line 1, item 0\)",
    ):
        TaskSet(path).build_index()
