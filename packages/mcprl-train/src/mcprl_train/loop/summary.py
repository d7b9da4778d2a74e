"""The run's summary: validation before and after each stage, timing, where things are (``summary.json``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mcprl_train.loop.state import TrainState

__all__ = ["run_summary"]


def run_summary(
    history: Sequence[Mapping[str, Any]],
    *,
    run_dir: Path,
    state: TrainState,
    grpo_steps: int,
    elapsed_s: float,
    val_tasks: int,
    teacher_success: float | None,
    resumed_from: str | None,
) -> dict[str, Any]:
    """The summary of a run from its metrics records (``history``, as written to ``metrics.jsonl``).

    ``success_last3_mean`` averages the last three periodic/final validations (the warm start's when the run
    has no GRPO steps): one evaluation is noisy, three show where the run ended up.
    """
    evals = [r for r in history if r["kind"] == "eval"]
    by_tag = {r.get("tag"): r for r in evals}
    tags = ("periodic", "final") if grpo_steps > 0 else ("sft", "warm_start")
    last = [float(r["val/success_rate"]) for r in evals if r.get("tag") in tags][-3:]

    def val(tag: str, key: str) -> float | None:
        r = by_tag.get(tag)
        return None if r is None or key not in r else float(r[key])

    return {
        "run_dir": str(run_dir),
        "steps": state.step,
        "sft_steps": state.sft_step,
        "elapsed_s": round(elapsed_s, 1),
        "val_tasks": val_tasks,
        "success_init": val("init", "val/success_rate"),
        "success_warm_start": val("warm_start", "val/success_rate"),
        "success_final": val("final", "val/success_rate"),
        "teacher_success_demos": teacher_success,
        "reward_init": val("init", "val/reward_mean"),
        "reward_warm_start": val("warm_start", "val/reward_mean"),
        "reward_final": val("final", "val/reward_mean"),
        "success_last3_mean": sum(last) / len(last) if last else None,
        "resumed_from": resumed_from,
    }
