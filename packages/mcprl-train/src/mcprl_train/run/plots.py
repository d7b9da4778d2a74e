"""PNG plots of a run from its ``metrics.jsonl`` (matplotlib's Agg canvas: no display, no pyplot state).

`write_plots(run_dir)` writes into ``<run>/plots/`` one figure per group of metrics (reward, success rate, KL,
losses, validation rates, the warm start's loss and token accuracy), each only when its metrics exist.
"""

# matplotlib leaves the **kwargs of its Axes/Figure methods unannotated, so every call is partially Unknown.
# pyright: reportUnknownMemberType=false

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from mcprl_train.run.run_dir import RunDir

__all__ = ["series", "write_plots"]

_EVAL_KEYS = ("val/success_rate", "val/reward_mean", "val/tools/error_rate")


def series(
    records: Sequence[dict[str, Any]], key: str, *, kind: str, x: str = "step"
) -> tuple[list[float], list[float]]:
    """``(x, y)`` of ``key`` over the records of ``kind`` that carry a finite number for it."""
    xs: list[float] = []
    ys: list[float] = []
    for record in records:
        value = record.get(key)
        if record.get("kind") != kind or not isinstance(value, int | float) or value != value:
            continue
        xs.append(float(record.get(x, 0)))
        ys.append(float(value))
    return xs, ys


def _figure(
    path: Path,
    title: str,
    lines: list[tuple[str, tuple[list[float], list[float]]]],
    *,
    xlabel: str = "step",
) -> Path | None:
    drawn = [(label, data) for label, data in lines if data[0]]
    if not drawn:
        return None
    # An Agg canvas per figure: no pyplot, no global backend switch, nothing to close.
    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label, (xs, ys) in drawn:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def write_plots(run_dir: RunDir) -> list[Path]:
    """Write the run's PNG plots into ``<run>/plots``; returns the files written."""
    records = run_dir.read_metrics().records
    out = run_dir.plots_dir
    loss_keys = sorted({k for r in records if r.get("kind") == "grpo" for k in r if k.startswith("loss/")})
    val_keys = [k for k in _EVAL_KEYS if any(k in r for r in records)]
    figures = [
        _figure(
            out / "reward.png",
            "reward",
            [
                ("train rollout/reward_mean", series(records, "rollout/reward_mean", kind="grpo")),
                ("validation val/reward_mean", series(records, "val/reward_mean", kind="eval")),
            ],
        ),
        _figure(
            out / "success_rate.png",
            "task success rate",
            [
                ("train rollout/success_rate", series(records, "rollout/success_rate", kind="grpo")),
                ("validation val/success_rate", series(records, "val/success_rate", kind="eval")),
            ],
        ),
        _figure(
            out / "kl.png",
            "KL",
            [
                ("to the reference (loss/kl)", series(records, "loss/kl", kind="grpo")),
                ("to the sampling policy (kl/approx)", series(records, "kl/approx", kind="grpo")),
                ("sampler to learner (mismatch/kl_k3)", series(records, "mismatch/kl_k3", kind="grpo")),
            ],
        ),
        _figure(out / "losses.png", "losses", [(k, series(records, k, kind="grpo")) for k in loss_keys]),
        _figure(out / "eval.png", "validation", [(k, series(records, k, kind="eval")) for k in val_keys]),
        _figure(
            out / "sft.png",
            "warm start (SFT)",
            [
                (k, series(records, k, kind="sft", x="sft_step"))
                for k in ("sft/loss", "sft/token_acc", "sft/turn_acc")
            ],
            xlabel="sft step",
        ),
    ]
    return [f for f in figures if f is not None]
