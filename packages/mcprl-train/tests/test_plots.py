from __future__ import annotations

from pathlib import Path

from PIL import Image

from mcprl_train.config import Config
from mcprl_train.run.plots import series, write_plots
from mcprl_train.run.run_dir import RunDir


def _run_dir(tmp_path: Path) -> RunDir:
    return RunDir.create(Config.load(overrides=[f"run.output_dir={tmp_path}", "run.name=p"]))


def test_plots_are_pngs_for_every_metric_family_present(tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    for step in range(1, 6):
        run_dir.write_metrics(
            "grpo",
            step,
            {
                "rollout/reward_mean": step / 10,
                "rollout/success_rate": step / 5,
                "loss/kl": 0.01 * step,
                "loss/policy": -0.1,
                "loss/total": 0.2,
            },
        )
        if step % 2 == 0:
            run_dir.write_metrics("eval", step, {"val/success_rate": 0.5, "val/reward_mean": 0.3})
    written = write_plots(run_dir)
    names = {p.name for p in written}
    assert names == {"reward.png", "success_rate.png", "kl.png", "losses.png", "eval.png"}
    for path in written:
        with Image.open(path) as image:
            assert image.format == "PNG"
            assert image.size == (700, 400)


def test_no_metrics_means_no_plots(tmp_path: Path) -> None:
    assert write_plots(_run_dir(tmp_path)) == []


def test_series_keeps_only_finite_numbers_of_the_kind() -> None:
    records = [
        {"kind": "grpo", "step": 1, "loss/kl": 0.1},
        {"kind": "eval", "step": 1, "loss/kl": 9.0},
        {"kind": "grpo", "step": 2, "loss/kl": float("nan")},
        {"kind": "grpo", "step": 3, "loss/kl": 0.3},
    ]
    assert series(records, "loss/kl", kind="grpo") == ([1.0, 3.0], [0.1, 0.3])
