from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from structlog.testing import capture_logs

from mcprl_train.errors import CheckpointError
from mcprl_train.run.checkpoint import CheckpointManager
from mcprl_train.typed_torch import manual_seed, optimizer_step


def _model_and_optimizer(seed: int) -> tuple[torch.nn.Linear, torch.optim.AdamW]:
    manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    torch.autograd.backward(model(torch.randn(2, 4)).sum())
    optimizer_step(optimizer)
    return model, optimizer


def _save(manager: CheckpointManager, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> Path:
    return manager.save(
        step,
        writers={"policy": lambda d: torch.save(model.state_dict(), d / "weights.pt")},
        state_dicts={"optimizer": opt.state_dict()},
        meta={"position": {"epoch": 1, "index": step}},
    ).path


def test_saved_checkpoint_restores_weights_optimizer_rng_and_meta(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "ckpt")
    model, opt = _model_and_optimizer(0)
    random.seed(7)
    manual_seed(7)
    _save(manager, 5, model, opt)
    expected = (random.random(), torch.rand(3))
    loaded = manager.load_latest()
    assert loaded is not None
    assert loaded.step == 5
    assert loaded.meta == {"position": {"epoch": 1, "index": 5}, "step": 5}
    other, other_opt = _model_and_optimizer(1)
    other.load_state_dict(torch.load(loaded.subdir("policy") / "weights.pt"))
    other_opt.load_state_dict(loaded.state("optimizer"))
    assert torch.equal(other.weight, model.weight)
    assert torch.equal(other_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    loaded.restore_rng()
    assert (random.random(), torch.rand(3)) == (expected[0], pytest.approx(expected[1]))


def test_latest_points_at_the_newest_and_only_the_last_k_are_kept(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    model, opt = _model_and_optimizer(0)
    for step in (1, 2, 3, 4):
        _save(manager, step, model, opt)
    assert [p.name for p in manager.directories()] == ["step-00000003", "step-00000004"]
    assert manager.latest_pointer() is not None
    assert manager.latest_pointer()[0] == "step-00000004"  # type: ignore[index]


def test_saving_the_same_step_again_replaces_it_atomically(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3)
    model, opt = _model_and_optimizer(0)
    _save(manager, 1, model, opt)
    _save(manager, 2, model, opt)
    second = manager.save(2, meta={"stage": "done"})
    assert second.path.name == "step-00000002-r1"
    assert [p.name for p in manager.directories()] == ["step-00000001", "step-00000002-r1"]
    loaded = manager.load_latest()
    assert loaded is not None
    assert loaded.meta["stage"] == "done"


def test_corrupt_latest_falls_back_to_the_previous_with_a_warning(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3)
    model, opt = _model_and_optimizer(0)
    _save(manager, 1, model, opt)
    newest = _save(manager, 2, model, opt)
    weights = newest / "policy" / "weights.pt"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    with capture_logs() as logs:
        loaded = manager.load_latest()
    assert loaded is not None
    assert loaded.step == 1
    assert "checksum mismatch in policy/weights.pt" in loaded.skipped["step-00000002"]
    assert {"checkpoint_invalid", "checkpoint_fallback"} <= {e["event"] for e in logs}


def test_a_manifest_edited_after_the_pointer_was_written_is_rejected(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    model, opt = _model_and_optimizer(0)
    _save(manager, 1, model, opt)
    newest = _save(manager, 2, model, opt)
    manifest = json.loads((newest / "manifest.json").read_text())
    manifest["step"] = 3
    (newest / "manifest.json").write_text(json.dumps(manifest))
    loaded = manager.load_latest()
    assert loaded is not None
    assert loaded.step == 1
    assert "does not match the hash" in loaded.skipped["step-00000002"]


def test_no_checkpoint_is_none_and_all_corrupt_is_an_error(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    assert manager.load_latest() is None
    model, opt = _model_and_optimizer(0)
    only = _save(manager, 1, model, opt)
    (only / "optimizer.pt").unlink()
    with pytest.raises(CheckpointError, match=r"file optimizer\.pt is missing"):
        manager.load_latest()


def test_a_writer_failing_midway_leaves_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    model, opt = _model_and_optimizer(0)
    _save(manager, 1, model, opt)

    def explode(directory: Path) -> None:
        (directory / "half.bin").write_bytes(b"x" * 100)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        manager.save(2, writers={"policy": explode})
    loaded = manager.load_latest()
    assert loaded is not None
    assert loaded.step == 1
    _save(manager, 2, model, opt)  # the next save clears the partial directory
    assert not list(tmp_path.glob(".tmp-*"))


_KILLED_WRITER = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    import torch
    from mcprl_train.run.checkpoint import CheckpointManager

    manager = CheckpointManager(Path(sys.argv[1]))
    manager.save(1, state_dicts={"weights": {"w": torch.ones(1000)}}, meta={"n": 1})

    def stall(directory):
        (directory / "part.bin").write_bytes(b"y" * 4096)
        print("WRITING", flush=True)
        sys.stdin.read()  # blocks until the parent kills us

    manager.save(2, writers={"policy": stall}, state_dicts={"weights": {"w": torch.zeros(1000)}})
    """
)


def test_sigkill_during_a_checkpoint_write_leaves_the_previous_loadable(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_WRITER, str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    try:
        lines = iter(proc.stdout.readline, "")
        assert any(line.strip() == "WRITING" for line in lines)  # the default structlog logger prints too
    finally:
        proc.kill()
        proc.wait(timeout=60)
        proc.stdout.close()
        if proc.stdin is not None:
            proc.stdin.close()
    assert list(tmp_path.glob(".tmp-step-00000002-*"))
    loaded = CheckpointManager(tmp_path).load_latest()
    assert loaded is not None
    assert loaded.step == 1
    assert torch.equal(loaded.state("weights")["w"], torch.ones(1000))
    assert loaded.skipped == {}


def test_a_crash_before_the_pointer_moves_keeps_the_previous_latest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = CheckpointManager(tmp_path, keep=3)
    model, opt = _model_and_optimizer(0)
    _save(manager, 1, model, opt)

    def crash(name: str, sha: str) -> None:
        raise KeyboardInterrupt  # the process dies between the rename and the pointer update

    with monkeypatch.context() as patch:
        patch.setattr(manager, "_point_latest", crash)
        with pytest.raises(KeyboardInterrupt):
            _save(manager, 2, model, opt)
    assert manager.latest_pointer() is not None
    assert manager.latest_pointer()[0] == "step-00000001"  # type: ignore[index]
    loaded = manager.load_latest()
    assert loaded is not None
    assert loaded.step == 1
    # the resumed run saves step 2 again: the stray complete copy is replaced, not duplicated
    again = _save(manager, 2, model, opt)
    assert again.name == "step-00000002-r1"
    assert [p.name for p in manager.directories()] == ["step-00000001", "step-00000002-r1"]
