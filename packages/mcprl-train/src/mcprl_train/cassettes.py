"""A run's tool manager: live servers, recording their calls (``tools.record``), or a replay (``tools.replay``).

A relative ``tools.record`` lands in the run directory; ``tools.replay`` is read as given (relative to the
working directory). A replayed run starts no server and lists the calls its cassette does not hold in
``<run>/replay_misses.jsonl`` (see `mcprl_tools.cassette` for how calls are matched across runs).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from mcprl_train.errors import TrainError

if TYPE_CHECKING:
    from mcprl_tools import ToolManager
    from mcprl_train.config import Config

MISS_REPORT = "replay_misses.jsonl"


def record_path(config: Config, run_path: Path) -> Path | None:
    """Where this run records its tool calls: ``tools.record``, relative paths inside ``run_path``."""
    record = config.tools.record
    if record is None:
        return None
    path = Path(record)
    return path if path.is_absolute() else run_path / path


def check_replay_cassette(config: Config) -> None:
    """Read ``tools.replay`` now, so a missing or malformed cassette fails before anything heavy.

    Raises:
        mcprl_tools.CassetteError: The cassette cannot be read or is malformed (names the file and line).
    """
    if config.tools.replay is not None:
        from mcprl_tools.cassette import CassettePlayer

        CassettePlayer(config.tools.replay)


def tool_manager(config: Config, run_path: Path, *, world_size: int = 1) -> ToolManager:
    """The run's `mcprl_tools.ToolManager` (not yet entered); the cassette, if any, is read here.

    Raises:
        TrainError: ``tools.record`` in a run of several processes (each would write the same file).
        mcprl_tools.CassetteError: ``tools.replay`` cannot be read or is malformed.
    """
    from mcprl_tools import ToolManager
    from mcprl_train import build

    tools = config.tools
    if tools.record is not None and world_size > 1:
        raise TrainError(
            f"tools.record: recording needs a single-process run (this one has {world_size} processes, "
            "which would write one cassette at once); record with distributed.num_gpus=1, replay with any"
        )
    servers = build.servers_config(config, missing_variables="keep" if tools.replay else "raise")
    if tools.replay is not None:
        return ToolManager(servers, replay=tools.replay, miss_report=run_path / MISS_REPORT)
    return ToolManager(servers, record=record_path(config, run_path))
