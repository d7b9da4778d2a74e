"""``plan --from-run``: a run's time projected from a probe run's measured phases.

The probe is a real ``mcprl-train`` run of the tiny demo (warm start, evaluations, GRPO steps, checkpoints).
Projected onto its own config, the plan must give back what the probe measured, phase by phase: that checks the
counting (how many evaluations, checkpoints and steps a config makes) against what the trainer did.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest
from train_testkit import plan_cli

from mcprl_train.commands.time_plan import checkpoints, evaluations, plan_time, probe_rates
from mcprl_train.config import Config
from mcprl_train.errors import PlanError
from mcprl_train.run.phases import PHASES_FILE
from mcprl_train.run.run_dir import read_jsonl

PROBE = (
    "run.steps=3",
    "eval.every=2",
    "eval.n_tasks=3",
    "sft.steps=4",
    "sft.batch_size=4",
    "grpo.tasks_per_step=2",
    "grpo.group_size=2",
    "run.checkpoint_every=2",
    "tracking.progress=false",
)


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("runs")
    sets = [arg for kv in (*PROBE, f"run.output_dir={out}") for arg in ("--set", kv)]
    subprocess.run(
        [sys.executable, "-m", "mcprl_train", "train", "--profile", "cpu", "--run-name", "probe", *sets],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return out / "probe"


def _config(*overrides: str) -> Config:
    return Config.load(profile="cpu", overrides=[*PROBE, *overrides])


def test_the_probes_own_config_projects_to_what_the_probe_measured(probe: Path) -> None:
    marks = read_jsonl(probe / PHASES_FILE).records
    phases = [m["phase"] for m in marks]
    # the counting formulas against what the trainer did
    assert phases.count("evaluation") == evaluations(_config()) == 3  # warm start, step 2, final
    assert phases.count("checkpoint") == checkpoints(_config()) == 3  # warm start, step 2, end
    rates = probe_rates(probe)
    plan = plan_time(_config(), rates)
    measured = {name: rate.seconds for name, rate in rates.phases.items() if name != "summary"}
    projected = {row.phase.replace(" ", "_"): row.total_s for row in plan.rows if row.units}
    assert projected.keys() == measured.keys()
    for name, seconds in measured.items():
        assert projected[name] == pytest.approx(seconds, rel=1e-9), name
    assert plan.differences == []
    grpo = ("collection", "update_and_collection", "update", "records")  # the cpu profile overlaps them
    assert "update_and_collection" in projected
    step = sum(projected[p] for p in grpo if p in projected) / 3
    assert plan.grpo_step_s == pytest.approx(step)


def test_each_phase_scales_with_its_own_units(probe: Path) -> None:
    rates = probe_rates(probe)
    base = {row.phase: row for row in plan_time(_config(), rates).rows}
    bigger = {
        row.phase: row
        for row in plan_time(
            _config(
                "run.steps=30", "grpo.tasks_per_step=4", "eval.n_tasks=6", "sft.steps=8", "sft.batch_size=8"
            ),
            rates,
        ).rows
    }
    assert bigger["collection"].per_unit_s == pytest.approx(2 * base["collection"].per_unit_s)  # 2x episodes
    assert bigger["collection"].units == 30
    assert bigger["warm start"].total_s == pytest.approx(4 * base["warm start"].total_s)  # 2x steps, 2x demos
    # 30 steps, every 2: 1 + 14 + 1 evaluations of 6 tasks, against the probe's 3 of 3
    assert bigger["evaluation"].total_s == pytest.approx(16 * 6 / 9 * base["evaluation"].total_s)
    assert bigger["startup"].total_s == base["startup"].total_s


def test_the_warm_starts_time_budget_caps_its_steps(probe: Path) -> None:
    rates = probe_rates(probe)
    per_step = rates.phases["warm_start"].per_unit
    plan = plan_time(_config("sft.steps=1000", f"sft.max_time_s={10 * per_step}"), rates)
    [row] = [r for r in plan.rows if r.phase == "warm start"]
    assert row.units == pytest.approx(10)


def test_the_cli_prints_the_projection_and_the_settings_the_probe_did_not_run(
    probe: Path, tmp_path: Path
) -> None:
    done = plan_cli(
        tmp_path,
        "--profile",
        "cpu",
        *[arg for kv in (*PROBE, "env.max_new_tokens_per_turn=99") for arg in ("--set", kv)],
        "--from-run",
        str(probe),
        columns=200,
    )
    assert done.returncode == 0, done.stderr
    assert "time, projected from the probe run" in done.stdout
    assert "env.max_new_tokens_per_turn: 99 here" in done.stdout
    total = plan_time(_config(), probe_rates(probe)).total_s
    assert not math.isnan(total)
    assert total > 0


def test_a_directory_that_is_not_a_run_is_named(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match=r"config\.yaml: not found"):
        probe_rates(tmp_path)
