from __future__ import annotations

import re
from pathlib import Path

import pytest

from mcprl_tasks import (
    DEMO_FAMILIES,
    FAMILIES,
    Universe,
    UnknownFamilyError,
    generate_split,
    read_tasks,
    split_combos,
    write_split,
)

UNIVERSE = Universe.first(12, style="short")


def _combo(task: dict[str, object]) -> tuple[object, ...]:
    meta = task["metadata"]
    assert isinstance(meta, dict)
    params = meta["params"]
    return (meta["family"], *sorted((k, str(v)) for k, v in params.items()))


def test_same_seed_gives_the_same_bytes(tmp_path: Path) -> None:
    a = write_split(
        tmp_path / "a",
        *generate_split(seed=5, n_train=300, n_val=60, families=list(FAMILIES), universe=UNIVERSE),
    )
    b = write_split(
        tmp_path / "b",
        *generate_split(seed=5, n_train=300, n_val=60, families=list(FAMILIES), universe=UNIVERSE),
    )
    for x, y in zip(a, b, strict=True):
        assert x.read_bytes() == y.read_bytes()


def test_different_seeds_give_different_sets() -> None:
    a, _ = generate_split(seed=1, n_train=100, n_val=10, families=DEMO_FAMILIES, universe=UNIVERSE)
    b, _ = generate_split(seed=2, n_train=100, n_val=10, families=DEMO_FAMILIES, universe=UNIVERSE)
    assert a != b


def test_validation_ids_and_combinations_are_disjoint_from_train() -> None:
    train, val = generate_split(seed=3, n_train=2000, n_val=400, families=list(FAMILIES), universe=UNIVERSE)
    assert len(train) == 2000
    assert len(val) == 400
    assert len({t["id"] for t in train}) == len(train)
    assert len({t["id"] for t in val}) == len(val)
    assert not {t["id"] for t in train} & {t["id"] for t in val}
    assert not {_combo(t) for t in train} & {_combo(t) for t in val}
    assert all("-val-" in t["id"] for t in val)


def test_split_combos_partitions_each_family() -> None:
    for family in FAMILIES.values():
        parts = split_combos(family, UNIVERSE, seed=0, val_fraction=0.2)
        everything = family.combos(UNIVERSE)
        assert sorted(map(str, parts["train"] + parts["val"])) == sorted(map(str, everything))
        assert parts["val"]
        assert parts["train"]


def test_families_are_drawn_round_robin_with_their_shape() -> None:
    train, _ = generate_split(seed=0, n_train=400, n_val=40, families=list(FAMILIES), universe=UNIVERSE)
    counts: dict[str, int] = {}
    for task in train:
        family = task["metadata"]["family"]
        counts[family] = counts.get(family, 0) + 1
        assert task["difficulty"] in ("easy", "medium", "hard")
        assert task["metadata"]["min_tool_calls"] >= 1
        assert set(task) == {
            "id",
            "prompt",
            "system",
            "servers",
            "tools",
            "difficulty",
            "answer",
            "checker",
            "metadata",
        }
    assert set(counts) == set(FAMILIES)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_unknown_family_names_the_choices() -> None:
    with pytest.raises(UnknownFamilyError, match="quote_mul"):
        generate_split(seed=0, n_train=1, n_val=1, families=["quote_multiply"], universe=UNIVERSE)


def test_universe_rejects_symbols_missing_from_the_fixture() -> None:
    with pytest.raises(ValueError, match="ZZZZ"):
        Universe(symbols=("ZZZZ", "YYYY"))


def test_multistep_task_needs_quotes_a_calculation_and_a_post() -> None:
    train, _ = generate_split(seed=0, n_train=60, n_val=6, families=["report_ratio"], universe=UNIVERSE)
    task = train[0]
    assert task["difficulty"] == "hard"
    assert task["servers"] in (["finance", "calculator", "messaging"], ["finance", "python", "messaging"])
    assert task["checker"]["type"] == "message_posted"
    assert task["checker"]["contains"] == task["answer"]
    assert re.fullmatch(r"-?\d+(\.\d{1,2})?", task["answer"])


def test_written_files_round_trip(tmp_path: Path) -> None:
    train, val = generate_split(seed=0, n_train=10, n_val=3, families=DEMO_FAMILIES, universe=UNIVERSE)
    train_path, val_path = write_split(tmp_path, train, val)
    assert train_path.name == "train.json"
    assert val_path.name == "validation.json"
    assert read_tasks(train_path) == train
    assert read_tasks(val_path) == val


def test_both_ways_of_computing_the_ratio_are_generated() -> None:
    train, _ = generate_split(seed=0, n_train=200, n_val=6, families=["report_ratio"], universe=UNIVERSE)
    computes = {t["metadata"]["params"]["compute"] for t in train}
    assert computes == {"python", "calculator"}
    for task in train:
        assert task["metadata"]["params"]["compute"] in task["servers"] or "python" not in task["servers"]


def test_search_questions_name_a_document_holding_the_answer() -> None:
    from mcprl_servers.corpus import load_corpus

    docs = {d["doc_id"]: d for d in load_corpus()}
    train, _ = generate_split(seed=0, n_train=50, n_val=5, families=["news_fact"], universe=UNIVERSE)
    for task in train:
        assert task["servers"] == ["search"]
        assert task["checker"] == {"type": "contains"}
        assert task["answer"] in docs[task["metadata"]["params"]["doc_id"]]["text"]


def test_messaging_families_use_only_the_messaging_server() -> None:
    families = ["channel_topic", "user_lookup", "who_posted", "relay"]
    train, val = generate_split(seed=0, n_train=80, n_val=20, families=families, universe=UNIVERSE)
    for task in train + val:
        assert task["servers"] == ["messaging"]
        if task["metadata"]["family"] == "relay":
            assert task["checker"]["type"] == "message_posted"
            assert task["checker"]["channel"] != task["metadata"]["params"]["source"]
