"""The ``train`` subcommand: the run to start or resume, the checks that fail before anything is written,
and the training run itself, in this process or on each rank that `mcprl_train.parallel.launch` starts."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mcprl_train.config import Config
from mcprl_train.errors import TrainError

if TYPE_CHECKING:
    from mcprl_train.build import TaskData
    from mcprl_train.loop.trainer import BackendFactory
    from mcprl_train.run.run_dir import RunDir

__all__ = ["run_training", "train"]


def train(
    load: Callable[[], Config],
    *,
    resume: str | None,
    run_name: str | None,
    overrides: Sequence[str],
    argv: Sequence[str],
) -> int:
    """``mcprl-train train``: returns the exit code.

    Args:
        load: The command line's config (profile ← ``--config`` ← ``--set``).
        resume: ``--resume``: a run directory, ``"latest"`` (the newest under ``run.output_dir``) or None.
        run_name: ``--run-name``.
        overrides: ``--set``, applied over a resumed run's saved config.
        argv: The arguments, for the re-launch under torchrun.
    """
    from mcprl_train import build
    from mcprl_train.cassettes import check_replay_cassette
    from mcprl_train.model_checks import require_model_ready

    config, resumed = _train_config(load, resume=resume, run_name=run_name, overrides=overrides)
    if config.distributed.backend == "deepspeed":
        from mcprl_train.parallel.launch import launched, relaunch, train_rank

        if not launched():
            # Nothing is created here: the workers resolve the run (rank 0) and share it.
            return relaunch(config.distributed.num_gpus, argv, device=config.model.device)

        def open_validated_run() -> tuple[Config, RunDir, bool]:
            require_model_ready(config)  # rank 0 fails before it writes anything
            build.load_tasks(config)  # the same; each rank's trainer reads them
            return _open_run(config, resumed)

        return train_rank(open_validated_run, run_training)
    require_model_ready(config)  # tokenizer, template, parser, vocabulary: before anything is written
    tasks = build.load_tasks(config)  # a missing or malformed task file fails before anything is written
    check_replay_cassette(config)
    config, run_dir, resuming = _open_run(config, resumed)
    summary = run_training(config, run_dir, resuming, tasks=tasks)
    print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0


def _locate_run(load: Callable[[], Config], resume: str, run_name: str | None) -> Path:
    """The run directory ``--resume`` names (the newest under ``run.output_dir`` for a bare ``--resume``)."""
    if resume != "latest":
        return Path(resume)
    output_dir = Path(load().run.output_dir)
    runs = sorted(output_dir.glob("*/config.yaml"), key=lambda p: p.stat().st_mtime, reverse=True)
    if run_name is not None:
        runs = [p for p in runs if p.parent.name == run_name]
    if not runs:
        raise TrainError(f"--resume: no run directory under {str(output_dir)!r} to resume")
    return runs[0].parent


def _train_config(
    load: Callable[[], Config], *, resume: str | None, run_name: str | None, overrides: Sequence[str]
) -> tuple[Config, RunDir | None]:
    """The config a ``train`` invocation runs and the run it resumes (None: a new run); creates nothing."""
    from mcprl_train.run.run_dir import RunDir

    if resume is None:
        config = load()
        if run_name is not None:
            config = config.replace([f"run.name={run_name}"])
        return config, None
    run_dir = RunDir.open(_locate_run(load, resume, run_name))
    return run_dir.load_config().replace(overrides), run_dir


def _open_run(config: Config, resumed: RunDir | None) -> tuple[Config, RunDir, bool]:
    """``(config, run directory, resume)``: a new run directory, or the resumed one with its config updated."""
    from mcprl_train.run.run_dir import RunDir

    if resumed is None:
        if config.env.template_date is None:  # the day every render of this run prints, resumed runs included
            config = config.replace([f"env.template_date={datetime.date.today().isoformat()}"])
        return config, RunDir.create(config), False
    resumed.write_config(config)
    return config, resumed, True


def run_training(
    config: Config,
    run_dir: RunDir,
    resume: bool,
    backend: BackendFactory | None = None,
    *,
    tasks: TaskData | None = None,
) -> dict[str, Any]:
    """One process's training run (one rank's in a data-parallel run); returns the summary.

    Rank 0 logs to the console and ``training.log``, tracks (wandb, weave) and writes the plots; the other
    ranks log warnings to stderr.
    """
    import structlog

    from mcprl_train import build, collectives
    from mcprl_train.cpu_threads import ThreadLoad
    from mcprl_train.loop.trainer import Trainer
    from mcprl_train.run.plots import write_plots
    from mcprl_train.run.tracking import Tracker, configure_logging

    main = collectives.rank() == 0
    configure_logging(
        level=config.tracking.log_level if main else "warning", log_file=run_dir.log_path if main else None
    )
    if collectives.world_size() > 1:
        structlog.contextvars.bind_contextvars(rank=collectives.rank())
        structlog.get_logger().info(
            "rank_started", world_size=collectives.world_size(), device=config.model.device
        )
    threads = ThreadLoad.measure()
    if build.resolve_device(config.model.device) == "cpu" and threads.contended:
        structlog.get_logger().warning("cpu_threads_contended", detail=threads.describe())
    tracker = Tracker(config, run_dir).start() if main else None
    try:
        trainer = Trainer(
            config,
            run_dir,
            resume=resume,
            backend=backend,
            tasks=tasks,
            sinks=(tracker,) if tracker is not None else (),
        )
        return trainer.run()
    finally:
        if tracker is not None:
            tracker.finish()
            write_plots(run_dir)
