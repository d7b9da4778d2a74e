"""``mcprl-train eval``: validation metrics of a saved checkpoint, appended to its run's ``metrics.jsonl``."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mcprl_train.errors import TrainError

__all__ = ["evaluate_checkpoint"]


async def evaluate_checkpoint(path: Path, overrides: Sequence[str]) -> dict[str, Any]:
    """Validation metrics of a checkpoint (``<run>/checkpoints/step-N``) or of a run's latest checkpoint.

    The run's saved config with ``overrides`` applied picks the tasks, the decoding (``eval.greedy``) and the
    tool servers (``tools.replay`` serves them from a cassette). Returns the summary that the CLI prints.
    """
    from mcprl_env import Environment
    from mcprl_train import build
    from mcprl_train.cassettes import tool_manager
    from mcprl_train.loop.collection import episode_concurrency
    from mcprl_train.loop.evaluation import evaluate_tasks
    from mcprl_train.run.run_dir import open_checkpoint

    run_dir, loaded = open_checkpoint(path)
    config = run_dir.load_config().replace(overrides)
    if config.tasks.validation is None:
        raise TrainError("tasks.validation is null: nothing to evaluate on (--set tasks.validation=FILE)")
    tools = tool_manager(config, run_dir.path)  # a bad cassette fails before the model loads
    policy = build.build_policy(config, source=str(loaded.subdir("policy")))
    policy.eval()
    sampler = build.build_sampler(config, policy, greedy=config.eval.greedy, seed=config.run.seed)
    tasks = build.validation_tasks(config, checker=build.default_checker(config))
    async with tools as manager:
        env = Environment(manager=manager, tokenizer=policy.tokenizer, config=config.env)
        metrics, _ = await evaluate_tasks(
            env,
            tasks,
            sampler,
            max_concurrent_episodes=episode_concurrency(config.collection, config.sampler),
            namespace=f"eval-{loaded.path.name}",
        )
        replayed = {k: v for k, v in manager.step_metrics().items() if k.startswith("tools/replay/")}
    metrics = {**metrics, **replayed}
    summary = {"checkpoint": str(loaded.path), "step": loaded.step, "tasks": len(tasks), **metrics}
    run_dir.write_metrics("eval", loaded.step, {**metrics, "tag": "checkpoint_eval"})
    return summary
