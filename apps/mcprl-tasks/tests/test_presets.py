from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from mcprl_tasks import DEMO_FAMILIES, PRESETS, UnknownPresetError, build_preset, load_preset, read_tasks
from mcprl_tasks.schema import write_tasks


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_shipped_preset_equals_its_generator(name: str, tmp_path: Path) -> None:
    train, val = build_preset(name)
    shipped_train, shipped_val = load_preset(name)
    assert write_tasks(tmp_path / "t.json", train).read_bytes() == shipped_train.read_bytes()
    assert write_tasks(tmp_path / "v.json", val).read_bytes() == shipped_val.read_bytes()


def test_demo_preset_is_small_short_and_large_enough() -> None:
    train_path, val_path = load_preset("demo")
    train, val = read_tasks(train_path), read_tasks(val_path)
    assert len(train) >= 2000
    assert len(val) >= 500
    symbols: set[str] = set()
    for task in train + val:
        assert task["metadata"]["family"] in DEMO_FAMILIES
        assert len(task["prompt"]) <= 48, task["prompt"]
        params = task["metadata"]["params"]
        symbols.update(params["symbols"])
        if "k" in params:
            assert 2 <= params["k"] <= 9
    # Enough symbols that a model cannot memorise prices: it has to copy them from the tool's answer.
    assert len(symbols) >= 150


def test_presets_files_are_json_arrays() -> None:
    for name in PRESETS:
        for path in load_preset(name):
            assert isinstance(json.loads(path.read_text()), list)


def test_unknown_preset_names_the_choices() -> None:
    with pytest.raises(UnknownPresetError, match=re.escape("demo")):
        load_preset("dmeo")
