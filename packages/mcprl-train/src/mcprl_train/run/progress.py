"""Rich progress bars for a run: the stage (SFT / GRPO steps), episode collection, and evaluation.

Shown only when `tracking.progress` is on and the console is a terminal; otherwise every method is a cheap
no-op, so logs written to files or CI stay plain JSON lines. The per-step summary line is a log event
(`grpo_step`), printed above the bars.
"""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

__all__ = ["RunProgress"]


class RunProgress:
    """Progress bars of one run.

    Args:
        enabled: Show bars (also requires a terminal unless `force` is set).
        console: Console to draw on (default: stderr).
        force: Draw even when the console is not a terminal (tests).
    """

    def __init__(self, *, enabled: bool = True, console: Console | None = None, force: bool = False) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = enabled and (force or self.console.is_terminal)
        self._progress: Progress | None = None
        self._stage: TaskID | None = None
        self._work: TaskID | None = None

    def __enter__(self) -> RunProgress:
        if self.enabled:
            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=self.console,
                transient=False,
            )
            self._progress.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def stage(self, description: str, *, total: int, completed: int = 0) -> None:
        """Start (or replace) the stage bar: SFT steps or GRPO steps."""
        if self._progress is None:
            return
        if self._stage is not None:
            self._progress.remove_task(self._stage)
        self._stage = self._progress.add_task(description, total=total, completed=completed)

    def step_done(self) -> None:
        """Advance the stage bar by one step."""
        if self._progress is not None and self._stage is not None:
            self._progress.advance(self._stage)

    def work(self, description: str, *, total: int) -> None:
        """Start the bar of the current unit of work (collecting groups, evaluating, updating)."""
        if self._progress is None:
            return
        self.work_done()
        self._work = self._progress.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        """Advance the current work bar."""
        if self._progress is not None and self._work is not None:
            self._progress.advance(self._work, n)

    def work_done(self) -> None:
        """Remove the current work bar."""
        if self._progress is not None and self._work is not None:
            self._progress.remove_task(self._work)
            self._work = None
