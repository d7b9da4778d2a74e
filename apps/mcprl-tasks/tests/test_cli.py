from __future__ import annotations

from pathlib import Path

import pytest

from mcprl_tasks import read_tasks
from mcprl_tasks.cli import main


def test_generate_writes_train_and_validation(tmp_path: Path) -> None:
    status = main(
        ["generate", "--out", str(tmp_path), "--seed", "4", "--n-train", "50", "--n-val", "10",
         "--families", "quote", "quote_mul", "--symbols", "20", "--style", "short"]
    )  # fmt: skip
    assert status == 0
    train, val = read_tasks(tmp_path / "train.json"), read_tasks(tmp_path / "validation.json")
    assert len(train) == 50
    assert len(val) == 10
    assert {t["metadata"]["family"] for t in train} == {"quote", "quote_mul"}


def test_unknown_family_is_a_clean_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["generate", "--out", str(tmp_path), "--families", "nope"])
    assert status == 2
    assert "unknown task family 'nope'" in capsys.readouterr().err


def test_lists_families_and_presets(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["families"]) == 0
    assert "quote_ratio" in capsys.readouterr().out
    assert main(["presets"]) == 0
    assert "demo:" in capsys.readouterr().out
