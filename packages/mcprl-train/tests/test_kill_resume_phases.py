"""The kill harness's own parts: the phase record, the kill schedule, where a kill landed, and what counts as
two equal runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kill_resume import describe_phase, draw_schedule, landed, read_phases, reference_timeline
from run_compare import max_logprob_gap, run_differences

from mcprl_train.config import Config
from mcprl_train.run.phases import PHASES_FILE, Phase, PhaseLog
from mcprl_train.run.run_dir import RunDir


def _run(tmp_path: Path, name: str = "r") -> RunDir:
    return RunDir.create(
        Config.load(overrides=[f"run.output_dir={tmp_path}", f"run.name={name}", "run.steps=3"])
    )


class _At:
    def __init__(self, stage: str = "sft", step: int = 0, sft_step: int = 0) -> None:
        self.stage, self.step, self.sft_step = stage, step, sft_step


def test_the_phase_log_writes_a_line_per_phase_change_and_none_for_the_same_phase(tmp_path: Path) -> None:
    log = PhaseLog(tmp_path / PHASES_FILE)
    log.announce("warm_start", _At(sft_step=0))
    log.announce("warm_start", _At(sft_step=1))
    log.announce("checkpoint", _At(sft_step=2))
    log.announce("collection", _At("grpo", 0, 2), step=1)
    log.announce("evaluation", _At("grpo", 1, 2), tag="final")
    marks = read_phases(tmp_path / PHASES_FILE)
    assert [m.key for m in marks] == [
        ("warm_start", "sft", 0, 0, None),
        ("checkpoint", "sft", 0, 2, None),
        ("collection", "grpo", 1, 2, None),
        ("evaluation", "grpo", 1, 2, "final"),
    ]
    assert [describe_phase(m) for m in marks] == [
        "warm start from SFT step 0",
        "checkpoint, SFT step 2",
        "collection, GRPO step 1",
        "evaluation final",
    ]
    PhaseLog(None).announce("startup", _At())  # another rank: nothing written, nothing raised


def test_two_checkpoints_in_a_row_of_other_stages_are_two_phases(tmp_path: Path) -> None:
    """``run.steps=0`` after a warm start: the GRPO stage's checkpoint, then at once the finished run's."""
    log = PhaseLog(tmp_path / PHASES_FILE)
    log.announce("checkpoint", _At("grpo", 0, 30))
    log.announce("checkpoint", _At("done", 0, 30))
    assert [m.stage for m in read_phases(tmp_path / PHASES_FILE)] == ["grpo", "done"]


def test_a_torn_phase_line_is_left_out_and_an_unknown_phase_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / PHASES_FILE
    log = PhaseLog(path)
    log.announce("startup", _At())
    with path.open("a") as handle:
        handle.write('{"phase": "upd')
    assert [m.phase for m in read_phases(path)] == ["startup"]
    path.write_text(
        '{"phase": "lunch", "stage": "sft", "step": 0, "sft_step": 0, "tag": null, "time": 1.0}\n'
    )
    with pytest.raises(ValueError, match="unknown phase 'lunch'"):
        read_phases(path)


def _reference(tmp_path: Path, phases: list[tuple[str, str, int, int]], name: str = "ref") -> Path:
    """A run directory whose phases.jsonl holds ``phases`` one second apart."""
    run = tmp_path / name
    run.mkdir()
    lines = [
        {"phase": p, "stage": st, "step": step, "sft_step": sft, "tag": None, "time": 1000.0 + i}
        for i, (p, st, step, sft) in enumerate(phases)
    ]
    (run / PHASES_FILE).write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run


_RUN = [
    ("startup", "sft", 0, 0),
    ("warm_start", "sft", 0, 0),
    ("checkpoint", "sft", 0, 10),
    ("warm_start", "sft", 0, 10),
    ("evaluation", "sft", 0, 20),
    ("checkpoint", "grpo", 0, 20),
    ("collection", "grpo", 1, 20),
    ("update", "grpo", 1, 20),
    ("records", "grpo", 1, 20),
    ("checkpoint", "grpo", 1, 20),
    ("collection", "grpo", 2, 20),
    ("update", "grpo", 2, 20),
    ("records", "grpo", 2, 20),
    ("checkpoint", "grpo", 2, 20),
    ("summary", "done", 2, 20),
]


def test_the_reference_timeline_gives_each_phase_its_start_and_length(tmp_path: Path) -> None:
    timeline = reference_timeline(_reference(tmp_path, _RUN))
    assert [s.index for s in timeline] == list(range(len(_RUN)))
    assert [s.start_s for s in timeline] == [float(i) for i in range(len(_RUN))]
    assert all(s.duration_s == 1.0 for s in timeline[:-1])
    assert timeline[-1].duration_s >= 0.0


def test_a_resumed_run_is_refused_as_a_reference(tmp_path: Path) -> None:
    run = _reference(tmp_path, [*_RUN[:4], *_RUN])
    with pytest.raises(ValueError, match="several attempts"):
        reference_timeline(run)
    with pytest.raises(ValueError, match=r"no phases\.jsonl"):
        reference_timeline(tmp_path)


@pytest.mark.parametrize("kills", [0, 3, 8, 25])
def test_the_schedule_draws_the_asked_number_of_points_an_equal_share_per_phase_in_run_order(
    tmp_path: Path, kills: int
) -> None:
    timeline = reference_timeline(_reference(tmp_path, _RUN))
    schedule = draw_schedule(timeline, kills, seed=3)
    assert len(schedule.points) == kills
    shares = schedule.per_phase()
    kinds: set[Phase] = {s.mark.phase for s in timeline}
    assert set(shares) <= kinds
    counts = [shares.get(k, 0) for k in kinds]
    assert max(counts) - min(counts) <= 1, shares
    assert [(p.index, p.offset_s) for p in schedule.points] == sorted(
        (p.index, p.offset_s) for p in schedule.points
    )
    for point in schedule.points:
        segment = timeline[point.index]
        assert point.key == segment.mark.key
        assert point.phase == segment.mark.phase
        assert 0.0 <= point.offset_s <= segment.duration_s
        assert point.at_s == segment.start_s + point.offset_s
    assert schedule.order[("update", "grpo", 2, 20, None)] == 11
    assert draw_schedule(timeline, kills, seed=3) == schedule
    if kills >= 8:
        assert draw_schedule(timeline, kills, seed=4) != schedule


def test_a_negative_number_of_kills_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="kills must be >= 0, got -1"):
        draw_schedule(reference_timeline(_reference(tmp_path, _RUN)), -1, seed=0)


def test_a_kill_lands_in_the_attempts_last_phase_with_what_the_files_show(tmp_path: Path) -> None:
    run = _run(tmp_path)
    assert landed(run.path, 0, set()) == (None, None)  # killed before the trainer wrote a phase
    log = PhaseLog(run.path / PHASES_FILE)
    log.announce("collection", _At("grpo", 0, 4), step=1)
    since = (run.path / PHASES_FILE).stat().st_size
    assert landed(run.path, since, set()) == (None, None)  # the marks before ``since`` are another attempt's
    log.announce("checkpoint", _At("grpo", 1, 4))
    mark, detail = landed(run.path, since, set())
    assert mark is not None
    assert mark.key == ("checkpoint", "grpo", 1, 4, None)
    assert detail is None
    (run.checkpoints.root / ".tmp-step-00000001-1-2").mkdir(parents=True)
    assert (
        landed(run.path, since, set())[1]
        == "checkpoint temporary directory half written (.tmp-step-00000001-1-2)"
    )
    assert landed(run.path, since, {".tmp-step-00000001-1-2"})[1] is None  # left by an earlier attempt
    run.trajectories_path.write_text('{"step": 1}\n{"st')
    assert landed(run.path, since, {".tmp-step-00000001-1-2"})[1] == "torn last line of trajectories.jsonl"


def _finished(tmp_path: Path, name: str, logprob: float, reward: float = 1.0, blob: bytes = b"w") -> Path:
    run = _run(tmp_path, name)
    run.write_metrics("grpo", 1, {"loss/policy": 0.5, "perf/step_s": 1.0, "sampler/decode_calls": 3.0})
    episode = {
        "episode_id": "e0",
        "reward": reward,
        "sampler_logprobs": [logprob],
        "metrics": {"wall_s": 0.1},
    }
    run.append_trajectories(1, [episode])
    run.write_summary({"steps": 1, "elapsed_s": 3.0, "run_dir": str(run.path), "resumed_from": None})

    def weights(path: Path) -> None:
        (path / "model.safetensors").write_bytes(blob)

    run.checkpoints.save(1, writers={"policy": weights}, meta={"state": {"step": 1, "elapsed_s": 2.0}})
    return run.path


def test_equal_runs_differ_in_nothing_but_clocks_and_names(tmp_path: Path) -> None:
    a = _finished(tmp_path, "a", -0.5)
    b = _finished(tmp_path, "b", -0.5)
    assert run_differences(a, b) == []


def test_a_reward_or_a_weight_that_differs_is_reported(tmp_path: Path) -> None:
    a = _finished(tmp_path, "a", -0.5)
    b = _finished(tmp_path, "b", -0.5, reward=0.0)
    assert run_differences(a, b, exact=False) == ["1 episodes differ, e.g. [(1, 'e0', 0)]"]
    c = _finished(tmp_path, "c", -0.5, blob=b"other")
    assert run_differences(a, c) == ["final weights differ: ['policy/model.safetensors']"]


def test_logprobs_within_the_batching_tolerance_are_equal_only_when_not_exact(tmp_path: Path) -> None:
    a = _finished(tmp_path, "a", -0.5)
    b = _finished(tmp_path, "b", -0.5 + 2e-6)
    assert run_differences(a, b, exact=False) == []
    assert run_differences(a, b) == ["1 episodes differ, e.g. [(1, 'e0', 0)]"]
    assert 1.9e-6 < max_logprob_gap(a, b) < 2.1e-6
    assert max_logprob_gap(a, a) == 0.0
