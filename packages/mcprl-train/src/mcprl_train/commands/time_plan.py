"""How long a config's run takes, projected from a probe run's measured phases (``plan --from-run DIR``).

The probe is a run of the same model on the same machine: the config itself with ``run.steps=1`` (or a few)
and a small ``eval.n_tasks``, or the first steps of the run being planned. Its ``phases.jsonl``
(`mcprl_train.run.phases`) times every phase; its ``metrics.jsonl`` counts the work each phase did. Each
phase's seconds per unit of work are scaled linearly to the planned config's units:

============================  ===============  ==================================================
phase                         unit             the planned run has
============================  ===============  ==================================================
startup                       the run          one
warm start                    an SFT step      ``sft.steps``, each ``sft.batch_size`` demonstrations
evaluation                    a task           ``eval.n_tasks`` per evaluation, `evaluations` of them
collection, update, records   an episode       ``grpo.tasks_per_step x grpo.group_size`` per step
checkpoint                    a checkpoint     `checkpoints` of them
============================  ===============  ==================================================

Linear scaling overestimates where more work is batched together (collecting twice the episodes at once costs
less than twice), and nothing in the probe measures settings it did not run: where the two configs differ in
what sets the speed (model, precision, device, layouts, token budgets, overlap), the plan lists the
differences under the table instead of guessing their effect.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import attrs
from rich.table import Table

from mcprl_train.config import Config
from mcprl_train.config.layers import is_dict
from mcprl_train.errors import PlanError
from mcprl_train.run.phases import PHASES_FILE
from mcprl_train.run.run_dir import CONFIG_FILE, METRICS_FILE, read_jsonl

__all__ = ["PhaseRate", "ProbeRates", "TimePlan", "checkpoints", "evaluations", "plan_time", "probe_rates"]

SPEED_KEYS: Final = (
    "model.name",
    "model.dtype",
    "model.device",
    "model.lora",
    "model.quantization",
    "sft.layout",
    "optim.layout",
    "optim.micro_batch_tokens",
    "env.max_new_tokens_per_turn",
    "env.max_total_tokens",
    "sampler.backend",
    "sampler.max_batch_size",
    "collection.overlap",
    "tools.offline",
)
"""Settings that change the seconds per unit of work: a probe that differs in one of them is listed."""


@attrs.frozen(kw_only=True)
class PhaseRate:
    """One phase of the probe: ``seconds`` over ``units`` of work (see the module docstring's table)."""

    seconds: float
    units: float

    @property
    def per_unit(self) -> float:
        return self.seconds / self.units if self.units else math.nan


@attrs.frozen(kw_only=True)
class ProbeRates:
    """What a probe run measured: per phase, its seconds and units of work; and the config it ran."""

    run_dir: Path
    config: Config
    phases: Mapping[str, PhaseRate]


@attrs.frozen(kw_only=True)
class PlanRow:
    phase: str
    per_unit_s: float
    unit: str
    units: float

    @property
    def total_s(self) -> float:
        return self.per_unit_s * self.units


@attrs.frozen(kw_only=True)
class TimePlan:
    """The projected run: rows per phase, the seconds of one GRPO step, and the probe's differences."""

    rows: Sequence[PlanRow]
    grpo_step_s: float
    differences: Sequence[str]
    probe: Path

    @property
    def total_s(self) -> float:
        return sum(r.total_s for r in self.rows if not math.isnan(r.total_s))


def probe_rates(run_dir: Path) -> ProbeRates:
    """Read a probe run's phase times and units of work.

    Raises:
        PlanError: the directory has no ``config.yaml``, ``phases.jsonl`` or ``metrics.jsonl`` (naming the file),
            or no phase that a projection needs was timed.
    """
    for name in (CONFIG_FILE, PHASES_FILE, METRICS_FILE):
        if not (run_dir / name).is_file():
            raise PlanError(
                f"{run_dir / name}: not found (plan --from-run takes a run directory of mcprl-train)"
            )
    config = Config.load(profile=None, config_file=run_dir / CONFIG_FILE)
    marks = read_jsonl(run_dir / PHASES_FILE).records
    metrics = read_jsonl(run_dir / METRICS_FILE).records
    if not marks:
        raise PlanError(f"{run_dir / PHASES_FILE}: no phase was recorded")
    end = max([float(m["time"]) for m in metrics] + [float(marks[-1]["time"])])
    seconds: dict[str, float] = defaultdict(float)
    for mark, after in zip(marks, [*marks[1:], None], strict=True):
        stop = float(after["time"]) if after is not None else end
        seconds[str(mark["phase"])] += max(0.0, stop - float(mark["time"]))
    episodes = float(
        sum(1 for m in metrics if m.get("kind") == "grpo")
        * config.grpo.tasks_per_step
        * config.grpo.group_size
    )
    units = {
        "startup": float(sum(1 for m in marks if m["phase"] == "startup")),
        "warm_start": float(sum(1 for m in metrics if m.get("kind") == "sft")),
        "evaluation": float(sum(float(m.get("val/groups", 0.0)) for m in metrics if m.get("kind") == "eval")),
        "collection": episodes,
        "update": episodes,
        "update_and_collection": episodes,
        "records": episodes,
        "checkpoint": float(sum(1 for m in marks if m["phase"] == "checkpoint")),
    }
    phases = {
        name: PhaseRate(seconds=seconds[name], units=units[name]) for name in units if seconds[name] > 0
    }
    if not any(name in phases for name in ("warm_start", "collection", "update_and_collection")):
        raise PlanError(f"{run_dir}: the probe timed neither a warm-start step nor a GRPO step")
    return ProbeRates(run_dir=run_dir, config=config, phases=phases)


def evaluations(config: Config) -> int:
    """Evaluations a run of ``config`` makes (`mcprl_train.loop.trainer.Trainer.stages`): one before GRPO (after
    the warm start, or of the initial model), every ``eval.every`` steps before the last, and a final one."""
    steps, every = config.run.steps, config.eval.every
    periodic = (steps - 1) // every if every and steps > 0 else 0
    final = 1 if steps > 0 or not config.sft.enabled else 0
    return 1 + periodic + final


def checkpoints(config: Config) -> int:
    """Checkpoints a run of ``config`` writes: after the warm start, every ``run.checkpoint_every`` steps and
    at the end (SFT-step checkpoints, ``sft.checkpoint_every``, included)."""
    steps, every = config.run.steps, config.run.checkpoint_every
    sft = config.sft.steps or 0
    sft_checkpoints = (sft - 1) // config.sft.checkpoint_every if config.sft.checkpoint_every and sft else 0
    after_warm_start = 1 if config.sft.enabled else 0
    return after_warm_start + sft_checkpoints + (steps // every if every else 0) + 1


def plan_time(config: Config, probe: ProbeRates) -> TimePlan:
    """Project ``config``'s run from ``probe`` (module docstring)."""
    rates = probe.phases
    ran = probe.config
    episodes = config.grpo.tasks_per_step * config.grpo.group_size

    def rate(phase: str) -> float:
        return rates[phase].per_unit if phase in rates else math.nan

    demos_ratio = config.sft.batch_size / ran.sft.batch_size
    # a demonstration file may hold another number than sft.demos
    sft_steps = config.sft.total_steps(config.sft.demos) if config.sft.enabled else 0
    if config.sft.max_time_s is not None and "warm_start" in rates:
        sft_steps = min(sft_steps, config.sft.max_time_s / (rate("warm_start") * demos_ratio))
    # With collection.overlap the probe's first collection and last update ran alone, the rest side by side:
    # each phase's share per episode is what the probe measured over all of its steps.
    grpo_phases = [p for p in ("collection", "update_and_collection", "update", "records") if p in rates]
    rows = [
        PlanRow(phase="startup", per_unit_s=rate("startup"), unit="run", units=1.0),
        PlanRow(
            phase="warm start", per_unit_s=rate("warm_start") * demos_ratio, unit="SFT step", units=sft_steps
        ),
        PlanRow(
            phase="evaluation",
            per_unit_s=rate("evaluation"),
            unit="task",
            units=float(evaluations(config) * config.eval.n_tasks),
        ),
        *(
            PlanRow(
                phase=name.replace("_", " "),
                per_unit_s=rate(name) * episodes,
                unit="GRPO step",
                units=float(config.run.steps),
            )
            for name in grpo_phases
        ),
        PlanRow(
            phase="checkpoint",
            per_unit_s=rate("checkpoint"),
            unit="checkpoint",
            units=float(checkpoints(config)),
        ),
    ]
    grpo_step = sum(r.per_unit_s for r in rows if r.unit == "GRPO step")
    return TimePlan(
        rows=rows,
        grpo_step_s=grpo_step,
        differences=_differences(config, ran),
        probe=probe.run_dir,
    )


def _differences(config: Config, probe: Config) -> list[str]:
    mine, theirs = config.to_dict(), probe.to_dict()
    out: list[str] = []
    for key in SPEED_KEYS:
        a, b = _get(mine, key), _get(theirs, key)
        if a != b:
            out.append(f"{key}: {a!r} here, {b!r} in the probe")
    return out


def _get(data: dict[str, Any], dotted: str) -> object:
    value: object = data
    for part in dotted.split("."):
        value = value.get(part) if is_dict(value) else None
    return value


def _duration(seconds: float) -> str:
    if math.isnan(seconds):
        return "not measured"
    minutes, sec = divmod(round(seconds), 60)
    return f"{minutes} min {sec:02d} s" if minutes else f"{seconds:.1f} s"


def render_time_plan(plan: TimePlan) -> Table:
    """The projection as a rich table: per phase its measured seconds per unit, the units, the total."""
    table = Table(title=f"time, projected from the probe run {plan.probe}")
    table.add_column("phase")
    table.add_column("per unit", justify="right")
    table.add_column("unit", style="dim")
    table.add_column("units", justify="right")
    table.add_column("total", justify="right")
    for row in plan.rows:
        if row.units:
            table.add_row(
                row.phase, _duration(row.per_unit_s), row.unit, f"{row.units:g}", _duration(row.total_s)
            )
    table.add_row("[bold]GRPO step[/bold]", _duration(plan.grpo_step_s), "", "", "")
    table.add_row("[bold]run[/bold]", "", "", "", f"[bold]{_duration(plan.total_s)}[/bold]")
    for difference in plan.differences:
        table.add_row("[dim]differs[/dim]", "", "", "", difference)
    return table
