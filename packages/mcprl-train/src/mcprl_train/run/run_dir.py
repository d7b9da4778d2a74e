"""The run directory ``outputs/<run>/`` and its crash-safe JSON-lines logs.

Layout::

    outputs/<run>/
      config.yaml           the resolved config (`Config.to_yaml`), rewritten atomically
      metrics.jsonl         one object per logged step: {"run", "kind", "step", "time", <metric keys>...}
      trajectories.jsonl    one object per episode: {"run", "step", "episode_id", ...} (the trainer's fields:
                            `mcprl_train.loop.collection.Collection.trajectory_records`)
      summary.json          the run's summary (`RunDir.write_summary`), written atomically at the end
      training.log          the structlog JSON lines of the run (`mcprl_train.run.tracking.configure_logging`)
      phases.jsonl          one line per phase change (warm start, collection, update, ...: `mcprl_train.run.phases`)
      plots/*.png           `mcprl_train.run.plots.write_plots`
      checkpoints/          `mcprl_train.run.checkpoint.CheckpointManager` (``step-00000010/``, ``latest``)

`RunDir` is a `mcprl_train.run.sinks.MetricsSink`; on resume `RunDir.rewind` cuts the logs back to the
restored checkpoint, so they hold exactly what an uninterrupted run had written at that checkpoint.

A record is appended with a single ``write`` of complete lines, then ``flush`` + ``fsync``: a crash leaves at
most one torn last line, never a half-line in the middle of the file.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import attrs
import structlog

from mcprl_train.config.layers import is_dict
from mcprl_train.errors import RunDirError
from mcprl_train.run.checkpoint import MANIFEST, Checkpoint, CheckpointManager, atomic_write, fsync_dir

if TYPE_CHECKING:
    from collections.abc import Sequence

    from mcprl_train.config import Config
    from mcprl_train.run.sinks import MetricKind, Record

__all__ = ["JsonlReadResult", "RewindReport", "RunDir", "read_jsonl", "read_jsonl_bytes"]

logger = structlog.get_logger()

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
TRAJECTORIES_FILE = "trajectories.jsonl"
SUMMARY_FILE = "summary.json"
LOG_FILE = "training.log"


@attrs.frozen(kw_only=True)
class JsonlReadResult:
    """Records of a JSON-lines file and what was skipped.

    Attributes:
        records: Every complete, parseable line in order.
        torn_line: The unparseable last line (a write cut by a crash), if any.
        bad_lines: 1-based numbers of unparseable lines before the last (corruption, not a torn write).
    """

    records: list[dict[str, Any]]
    torn_line: str | None = None
    bad_lines: tuple[int, ...] = ()


@attrs.frozen(kw_only=True)
class RewindReport:
    """What `RunDir.rewind` removed from the logs."""

    step: int
    torn_lines: dict[str, str] = attrs.field(factory=dict[str, str])
    dropped: dict[str, int] = attrs.field(factory=dict[str, int])

    @property
    def clean(self) -> bool:
        """Nothing had to be removed."""
        return not self.torn_lines and not any(self.dropped.values())


def read_jsonl(path: Path) -> JsonlReadResult:
    """Read JSON lines, skipping a torn last line and reporting it (and any corrupt earlier line).

    Every append ends with a newline, so text after the last newline is a write cut short by a crash.
    """
    if not path.exists():
        return JsonlReadResult(records=[])
    return read_jsonl_bytes(path.read_bytes())


def read_jsonl_bytes(data: bytes) -> JsonlReadResult:
    """`read_jsonl` of a file's contents."""
    body, sep, tail = data.rpartition(b"\n")
    records: list[dict[str, Any]] = []
    bad: list[int] = []
    for number, line in enumerate(body.split(b"\n") if sep else [], start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            value = None
        if is_dict(value):
            records.append(value)
        else:
            bad.append(number)
    torn = tail.decode("utf-8", errors="replace") if tail.strip() else None
    return JsonlReadResult(records=records, torn_line=torn, bad_lines=tuple(bad))


class RunDir:
    """One run's directory. Create with `RunDir.create` (new run) or `RunDir.open` (existing run)."""

    def __init__(self, path: str | Path, *, keep_checkpoints: int = 3) -> None:
        self.path = Path(path)
        self.name = self.path.name
        self.config_path = self.path / CONFIG_FILE
        self.metrics_path = self.path / METRICS_FILE
        self.trajectories_path = self.path / TRAJECTORIES_FILE
        self.summary_path = self.path / SUMMARY_FILE
        self.log_path = self.path / LOG_FILE
        self.plots_dir = self.path / "plots"
        self.checkpoints = CheckpointManager(self.path / "checkpoints", keep=keep_checkpoints)
        self._seen_episodes: set[tuple[str, int, str]] | None = None

    # -- construction ---------------------------------------------------------------------------------------

    @classmethod
    def create(cls, config: Config, *, name: str | None = None) -> RunDir:
        """A new run directory ``<config.run.output_dir>/<name>`` with the resolved ``config.yaml``.

        Args:
            config: The resolved config (saved as ``config.yaml``).
            name: Run name; defaults to ``config.run.name`` or ``<profile>-<UTC timestamp>``.

        Raises:
            RunDirError: the directory already holds a run (use `RunDir.open` to resume it).
        """
        run_name = (
            name or config.run.name or f"{config.profile}-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}"
        )
        path = Path(config.run.output_dir) / run_name
        if (path / CONFIG_FILE).exists() or (path / METRICS_FILE).exists():
            raise RunDirError(
                f"run directory {str(path)!r} already holds a run; resume it with --resume {path} "
                "or choose another --run-name"
            )
        path.mkdir(parents=True, exist_ok=True)
        run_dir = cls(path, keep_checkpoints=config.run.keep_checkpoints)
        run_dir.write_config(config)
        return run_dir

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        """An existing run directory (for resume, evaluation or plots).

        Raises:
            RunDirError: ``path`` is not a run directory (no ``config.yaml``).
        """
        root = Path(path)
        if not (root / CONFIG_FILE).is_file():
            raise RunDirError(f"{str(root)!r} is not a run directory (no {CONFIG_FILE})")
        run_dir = cls(root)
        run_dir.checkpoints = CheckpointManager(
            root / "checkpoints", keep=run_dir.load_config().run.keep_checkpoints
        )
        return run_dir

    # -- files ----------------------------------------------------------------------------------------------

    def write_config(self, config: Config) -> None:
        """Write ``config.yaml`` atomically (temp file + fsync + rename)."""
        atomic_write(self.config_path, config.to_yaml().encode("utf-8"))

    def load_config(self) -> Config:
        """The config saved in ``config.yaml``."""
        from mcprl_train.config import Config

        return Config.load(profile=None, config_file=self.config_path)

    # -- the sink protocol (`mcprl_train.run.sinks.MetricsSink`) --------------------------------------------

    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None:
        """Append one metrics record (``kind``: ``grpo``, ``sft``, ``eval``) and fsync it."""
        _append_lines(
            self.metrics_path,
            [{"run": self.name, "kind": kind, "step": int(step), "time": time.time(), **record}],
        )

    def write_episodes(self, step: int, episodes: Sequence[Mapping[str, object]]) -> None:
        """The step's episodes in one write, fsynced, duplicates dropped (`append_trajectories`)."""
        self.append_trajectories(step, episodes)

    def append_trajectories(self, step: int, episodes: Iterable[Mapping[str, object]]) -> int:
        """Append episode records of ``step`` in one write + fsync; returns how many were new.

        Each record needs an ``episode_id``; ``run`` and ``step`` are filled in. A record whose
        ``(run, step, episode_id)`` is already in the file is dropped (resume never duplicates an episode).
        """
        seen = self._seen()
        fresh: list[dict[str, object]] = []
        for record in episodes:
            if "episode_id" not in record:
                raise RunDirError(f"trajectory record without 'episode_id': keys {sorted(record)}")
            key = (self.name, int(step), str(record["episode_id"]))
            if key in seen:
                continue
            seen.add(key)
            fresh.append({"run": self.name, "step": int(step), **record})
        if fresh:
            _append_lines(self.trajectories_path, fresh)
        return len(fresh)

    def write_summary(self, summary: Mapping[str, object]) -> None:
        """``summary.json``, written atomically (temp file + fsync + rename)."""
        atomic_write(self.summary_path, (json.dumps(summary, indent=2) + "\n").encode("utf-8"))

    def _seen(self) -> set[tuple[str, int, str]]:
        if self._seen_episodes is None:
            result = read_jsonl(self.trajectories_path)
            self._seen_episodes = {
                (str(r.get("run", self.name)), int(r["step"]), str(r["episode_id"]))
                for r in result.records
                if "step" in r and "episode_id" in r
            }
        return self._seen_episodes

    # -- reading and resume ---------------------------------------------------------------------------------

    def read_metrics(self) -> JsonlReadResult:
        return read_jsonl(self.metrics_path)

    def read_trajectories(self) -> JsonlReadResult:
        return read_jsonl(self.trajectories_path)

    def log_marks(self) -> dict[str, int]:
        """The logs' sizes in bytes now: a checkpoint stores them so a resume cuts the logs where it was saved.

        A step's number alone cannot say where: the warm start logs many records at GRPO step 0, and the final
        validation is logged at the last step after that step's checkpoint.
        """
        return {
            path.name: path.stat().st_size if path.exists() else 0
            for path in (self.metrics_path, self.trajectories_path)
        }

    def rewind(self, step: int, *, marks: Mapping[str, int] | None = None) -> RewindReport:
        """Make the logs end where the checkpoint being resumed was saved: cut a torn last line, drop later records.

        Call it on resume, before the first new append, with the restored checkpoint's step and its
        `log_marks` (``marks``). With marks, every record written after the mark is dropped, except the
        ``checkpoint_eval`` records that ``mcprl-train eval`` appends (not the trainer's). Without marks (a
        checkpoint saved before they existed, or no checkpoint: ``step=-1``), records of steps after ``step``
        are dropped. Files are rewritten atomically; a torn line and dropped counts are logged as warnings
        and returned.
        """
        torn: dict[str, str] = {}
        dropped: dict[str, int] = {}
        for path in (self.metrics_path, self.trajectories_path):
            if not path.exists():
                continue
            result = read_jsonl(path)
            kept_before = _records_before(path, marks.get(path.name)) if marks is not None else None
            if kept_before is None:
                keep = [r for r in result.records if int(r.get("step", 0)) <= step]
            else:
                later = result.records[kept_before:]
                keep = result.records[:kept_before] + [r for r in later if r.get("tag") == "checkpoint_eval"]
            if result.torn_line is not None:
                torn[path.name] = result.torn_line[:200]
                logger.warning("torn_line_skipped", file=str(path), line=result.torn_line[:200])
            if result.bad_lines:
                logger.warning("corrupt_lines_skipped", file=str(path), lines=list(result.bad_lines))
            dropped[path.name] = len(result.records) - len(keep)
            if result.torn_line is not None or result.bad_lines or dropped[path.name]:
                atomic_write(path, "".join(_dump(r) for r in keep).encode("utf-8"))
        self._seen_episodes = None
        report = RewindReport(step=step, torn_lines=torn, dropped=dropped)
        if not report.clean:
            logger.warning("run_logs_rewound", step=step, dropped=dropped, torn=sorted(torn))
        return report


def _records_before(path: Path, mark: int | None) -> int | None:
    """How many complete records ``path`` holds in its first ``mark`` bytes; None when ``mark`` is not the end
    of a line there (the file was rewritten since the mark was taken)."""
    if mark is None:
        return None
    with path.open("rb") as handle:
        head = handle.read(mark)
    if len(head) != mark or (mark and not head.endswith(b"\n")):
        logger.warning("log_mark_not_at_a_line_end", file=str(path), mark=mark)
        return None
    return len(read_jsonl_bytes(head).records)


def _dump(record: Mapping[str, Any]) -> str:
    return json.dumps(record, separators=(",", ":"), default=_json_default, allow_nan=True) + "\n"


def _json_default(value: object) -> object:
    item = getattr(value, "item", None)  # numpy / torch scalars
    if callable(item):
        return item()
    if attrs.has(type(value)):
        return attrs.asdict(value)
    if isinstance(value, set | frozenset | tuple):
        return list(cast("Iterable[object]", value))
    return str(value)


def _append_lines(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    payload = "".join(_dump(r) for r in records).encode("utf-8")
    new = not path.exists()
    with path.open("ab") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    if new:
        fsync_dir(path.parent)


def open_checkpoint(path: Path) -> tuple[RunDir, Checkpoint]:
    """The run and the verified checkpoint at ``path``: a checkpoint directory, or a run's latest checkpoint.

    Raises:
        RunDirError: ``path`` is missing, neither a checkpoint nor a run directory, or the run has no checkpoint.
        CheckpointError: the checkpoint fails verification (the message names the file).
    """
    if not path.exists():
        raise RunDirError(f"{path}: no such checkpoint or run directory")
    if (path / MANIFEST).is_file():
        return RunDir.open(path.parent.parent), CheckpointManager(path.parent).load(path)
    if not (path / CONFIG_FILE).is_file():
        raise RunDirError(
            f"{path}: neither a checkpoint (no {MANIFEST}) nor a run directory (no {CONFIG_FILE})"
        )
    run_dir = RunDir.open(path)
    loaded = run_dir.checkpoints.load_latest()
    if loaded is None:
        raise RunDirError(f"{path}: the run has no checkpoint (no {run_dir.checkpoints.root}/step-*)")
    return run_dir, loaded
