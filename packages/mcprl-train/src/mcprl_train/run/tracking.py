"""Logging and experiment tracking: the only place mcprl configures structlog, wandb and weave.

`configure_logging` renders structlog to stderr (colours on a TTY, JSON lines otherwise) and tees every event
into the run's ``training.log``; libraries only call ``structlog.get_logger()``. `Tracker` is the
`mcprl_train.run.sinks.MetricsSink` of wandb (mode: `resolve_wandb_mode`; ``disabled`` never imports it) and
weave, which has no offline mode: it needs ``WANDB_API_KEY`` (``WEAVE_DISABLED=true`` makes it a no-op).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from collections.abc import Generator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Literal

import structlog

from mcprl_tools.config import REDACTED
from mcprl_train.config import Config, InlineServers
from mcprl_train.errors import TrackingError
from mcprl_train.run.run_dir import RunDir

if TYPE_CHECKING:
    from mcprl_train.run.sinks import MetricKind, Record

__all__ = ["Tracker", "configure_logging", "resolve_wandb_mode", "weave_disabled"]

logger = structlog.get_logger()

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}
_WANDB_HINT = "install the tracking extra: pip install 'mcprl-train[tracking]' (or uv sync --extra tracking)"


class _JsonLinesTee:
    """A structlog processor writing each event dict as one JSON line to a file (then passing it on)."""

    def __init__(self, handle: IO[str]) -> None:
        self.handle = handle

    def __call__(
        self, _logger: structlog.typing.WrappedLogger, _name: str, event_dict: structlog.typing.EventDict
    ) -> structlog.typing.EventDict:
        self.handle.write(json.dumps(event_dict, default=str) + "\n")
        self.handle.flush()
        return event_dict


_log_file: IO[str] | None = None


def configure_logging(
    *, level: str = "info", log_file: Path | None = None, json_output: bool | None = None
) -> None:
    """Configure structlog for the process (call once, from the CLI).

    Args:
        level: Minimum level (``debug``, ``info``, ``warning``, ``error``).
        log_file: Also append every event as a JSON line here (the run's ``training.log``).
        json_output: Render the console as JSON lines; default: colours on a TTY, JSON otherwise.
    """
    global _log_file
    if _log_file is not None:
        _log_file.close()
        _log_file = None
    use_json = (not sys.stderr.isatty()) if json_output is None else json_output
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
        structlog.processors.format_exc_info,
    ]
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        _log_file = log_file.open("a", encoding="utf-8")
        processors.append(_JsonLinesTee(_log_file))
    processors.append(
        structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer(colors=True)
    )
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


WandbMode = Literal["online", "offline", "disabled"]


def resolve_wandb_mode(setting: str, env: Mapping[str, str] | None = None) -> WandbMode:
    """The wandb mode for ``tracking.wandb`` = ``setting`` given the environment.

    ``auto``: ``WANDB_MODE`` if set, else online with ``WANDB_API_KEY``, else offline.
    """
    environ = os.environ if env is None else env
    match setting:
        case "online" | "offline" | "disabled":
            return setting
        case "auto":
            forced = environ.get("WANDB_MODE", "").strip().lower()
            if forced in ("online", "offline", "disabled"):
                return forced  # type: ignore[return-value]
            if forced == "dryrun":
                return "offline"
            return "online" if environ.get("WANDB_API_KEY") else "offline"
        case _:
            raise TrackingError(f"tracking.wandb: unknown mode {setting!r}")


def weave_disabled(env: Mapping[str, str]) -> bool:
    """Whether ``WEAVE_DISABLED`` turns weave off (1, true or yes, any case)."""
    return env.get("WEAVE_DISABLED", "").strip().lower() in ("1", "true", "yes")


class Tracker:
    """wandb metrics and weave episode traces of one run.

    Args:
        config: The resolved config (``tracking`` section; logged as the wandb run config).
        run_dir: The run directory (wandb files go to ``<run>/wandb``; its name labels the runs and episodes).
    """

    def __init__(self, config: Config, run_dir: RunDir) -> None:
        self.config = config
        self.run_dir = run_dir
        self.wandb_mode: WandbMode = "disabled"
        self._wandb_run: Any = None
        self._weave_op: Any = None

    def start(self, env: Mapping[str, str] | None = None) -> Tracker:
        """Start wandb and weave as configured.

        Raises:
            TrackingError: wandb/weave requested but not installed, or weave enabled without an API key.
        """
        environ = os.environ if env is None else env
        tracking = self.config.tracking
        self.wandb_mode = resolve_wandb_mode(tracking.wandb, environ)
        if tracking.weave and not weave_disabled(environ) and not environ.get("WANDB_API_KEY"):
            raise TrackingError(
                "tracking.weave is enabled but WANDB_API_KEY is not set: weave has no offline mode. "
                "Set WANDB_API_KEY, or tracking.weave=false, or WEAVE_DISABLED=true"
            )
        if self.wandb_mode != "disabled":
            self._start_wandb(explicit=tracking.wandb != "auto")
        if tracking.weave:
            self._start_weave()
        return self

    def _start_wandb(self, *, explicit: bool) -> None:
        try:
            import wandb
        except ImportError as exc:
            if explicit:
                raise TrackingError(f"tracking.wandb={self.wandb_mode} needs wandb: {_WANDB_HINT}") from exc
            logger.info("wandb_unavailable", hint=_WANDB_HINT)
            self.wandb_mode = "disabled"
            return
        errors = _wandb_errors()
        stable = _wandb_id(self.run_dir)
        try:
            self._wandb_run = self._init_wandb(wandb, stable)
        except errors as exc:
            # A wandb-core service shared with other processes (a parent's, exported in WANDB_SERVICE) still
            # holds the stream of a run killed before it could finish: wandb refuses that id ("is in use").
            # A fresh id, linked to the old one in the config, keeps the resumed run tracked.
            fresh = f"{stable}-{secrets.token_hex(3)}"
            logger.warning("wandb_resume_refused", id=stable, error=str(exc), new_id=fresh)
            try:
                self._wandb_run = self._init_wandb(wandb, fresh, resumed_from=stable)
            except errors as again:
                logger.warning(
                    "wandb_unavailable", error=str(again), detail="the run continues without wandb"
                )
                self.wandb_mode = "disabled"
                return
        logger.info(
            "wandb_started", mode=self.wandb_mode, id=self._wandb_run.id, dir=str(self.run_dir.path / "wandb")
        )

    def _init_wandb(self, wandb: Any, run_id: str, *, resumed_from: str | None = None) -> Any:
        """``wandb.init`` of this run under ``run_id`` (resumed when that run exists), ``argv`` redacted."""
        source = self.config.tools.source
        secrets_ = source.literal_secrets() if isinstance(source, InlineServers) else frozenset[str]()
        config = self.config.to_dict(redact=True)
        if resumed_from is not None:
            config["wandb_resumed_from"] = resumed_from
        with _argv_redacted(secrets_):
            return wandb.init(
                project=self.config.tracking.project,
                name=self.run_dir.name,
                id=run_id,
                resume="allow",
                dir=str(self.run_dir.path),
                config=config,
                mode=self.wandb_mode,
            )

    def _start_weave(self) -> None:
        try:
            import weave
        except ImportError as exc:
            raise TrackingError(f"tracking.weave needs weave: {_WANDB_HINT}") from exc
        try:
            weave.init(self.config.tracking.project)
        except Exception as exc:  # weave raises no error type of its own; any failure here means no tracing
            raise TrackingError(
                f"weave could not start for project {self.config.tracking.project!r}: {exc}"
            ) from exc

        @weave.op(name="episode")
        def episode(record: dict[str, Any]) -> dict[str, Any]:
            return {k: record.get(k) for k in ("reward", "success", "valid", "stop_reason", "answer")}

        self._weave_op = episode

    def _drop_wandb(self, what: str, exc: BaseException) -> None:
        """Stop logging to a wandb run that failed (the run's own files still hold every record)."""
        logger.warning(f"wandb_{what}_failed", error=str(exc), detail="the run continues without wandb")
        self._wandb_run = None
        self.wandb_mode = "disabled"

    # -- the sink protocol (`mcprl_train.run.sinks.MetricsSink`) --------------------------------------------

    def write_metrics(self, kind: MetricKind, step: int, record: Record) -> None:
        """Log the record's numbers to wandb at ``step``.

        GRPO keys are logged as they are; a bare key of an SFT or eval record gets its kind as prefix
        (``sft/step``, ``eval/sft_step``) so the three kinds do not overwrite each other's panels.
        """
        if self._wandb_run is None:
            return
        prefix = "" if kind == "grpo" else f"{kind}/"
        full: dict[str, Any] = {"kind": kind, "step": step, **record}
        numeric = {
            k if "/" in k or not prefix else f"{prefix}{k}": v
            for k, v in full.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        try:
            self._wandb_run.log(numeric, step=step)
        except _wandb_errors() as exc:
            self._drop_wandb("log", exc)

    def write_episodes(self, step: int, episodes: Sequence[Mapping[str, object]]) -> None:
        """Trace each episode of ``step`` as a weave call (labelled with the run and step, as on disk)."""
        if self._weave_op is not None:
            for episode in episodes:
                self._weave_op({"run": self.run_dir.name, "step": step, **episode})

    def write_summary(self, summary: Mapping[str, object]) -> None:
        """Set the wandb run's summary to the run's (non-null) summary fields."""
        if self._wandb_run is not None:
            try:
                self._wandb_run.summary.update({k: v for k, v in summary.items() if v is not None})
            except _wandb_errors() as exc:
                self._drop_wandb("summary", exc)

    def finish(self) -> None:
        """Close the wandb run (flushes offline files)."""
        if self._wandb_run is not None:
            try:
                self._wandb_run.finish()
            except _wandb_errors() as exc:
                logger.warning("wandb_finish_failed", error=str(exc), run_dir=str(self.run_dir.path))
            self._wandb_run = None
        if self._weave_op is not None:
            import weave

            weave.finish()
            self._weave_op = None


def _wandb_errors() -> tuple[type[BaseException], ...]:
    """What wandb raises when its service refuses or loses a run: its own errors and its mailbox's."""
    from wandb.errors import Error
    from wandb.sdk.mailbox import HandleAbandonedError, MailboxClosedError
    from wandb.sdk.mailbox.mailbox_handle import ServerResponseError

    return (Error, ServerResponseError, HandleAbandonedError, MailboxClosedError)


def _wandb_id(run_dir: RunDir) -> str:
    """A stable wandb run id per run directory, so a resumed run continues the same wandb run."""
    import hashlib

    return hashlib.sha256(str(run_dir.path.resolve()).encode()).hexdigest()[:16]


@contextmanager
def _argv_redacted(secrets: frozenset[str]) -> Generator[None]:
    """``sys.argv`` with every secret replaced by `REDACTED` while wandb reads it.

    wandb records the command line (``args`` in ``wandb-metadata.json``, synced to the server); a secret given
    as ``--set tools.mcp_servers.NAME.env.KEY=VALUE`` would otherwise be stored there in clear.
    """
    saved = sys.argv
    if secrets:
        ordered = sorted(secrets, key=len, reverse=True)

        def hide(arg: str) -> str:
            for secret in ordered:
                arg = arg.replace(secret, REDACTED)
            return arg

        sys.argv = [hide(arg) for arg in saved]
    try:
        yield
    finally:
        sys.argv = saved
