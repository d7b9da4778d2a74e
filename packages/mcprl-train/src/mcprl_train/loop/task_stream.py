"""The training task stream: epochs of a shuffled task set, with a position that checkpoints exactly.

The position is `(epoch, index)` into `TaskSet.epoch_order(epoch, seed=...)`, a permutation that depends only
on the seed and the epoch, so a resumed run takes exactly the tasks an uninterrupted run would have taken
next — across epoch boundaries too — and never replays or skips one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import attrs

from mcprl_env import Task
from mcprl_train.errors import ConfigError


class IndexedTasks(Protocol):
    """Random access into a task set (satisfied by `mcprl_env.TaskSet`)."""

    def __len__(self) -> int: ...
    def task_at(self, index: int) -> Task: ...
    def epoch_order(self, epoch: int, *, seed: int) -> Sequence[int]: ...


@attrs.frozen(kw_only=True)
class StreamPosition:
    """Where the next task comes from: position `index` of epoch `epoch`'s permutation."""

    epoch: int = 0
    index: int = 0
    taken: int = 0

    def to_dict(self) -> dict[str, int]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StreamPosition:
        return cls(epoch=int(data["epoch"]), index=int(data["index"]), taken=int(data.get("taken", 0)))


class TaskStream:
    """Endless epochs over a task set in a seeded order.

    Args:
        tasks: The task set.
        seed: Seed of every epoch's permutation.
        position: Where to start (a restored checkpoint's position).
    """

    def __init__(self, tasks: IndexedTasks, *, seed: int, position: StreamPosition | None = None) -> None:
        if len(tasks) == 0:
            raise ValueError("the training task set is empty")
        self.tasks = tasks
        self.seed = seed
        self.position = position or StreamPosition()
        self._order: Sequence[int] | None = None
        self._order_epoch = -1

    def _order_for(self, epoch: int) -> Sequence[int]:
        if self._order is None or self._order_epoch != epoch:
            self._order = self.tasks.epoch_order(epoch, seed=self.seed)
            self._order_epoch = epoch
        return self._order

    def take(self, n: int) -> list[Task]:
        """The next `n` tasks. Within one call task ids are distinct (a batch never holds a task twice).

        Raises:
            ConfigError: the set holds fewer than `n` distinct task ids (a step could never be filled).
        """
        out: list[Task] = []
        seen: set[str] = set()
        pos = self.position
        scanned = 0
        while len(out) < n:
            order = self._order_for(pos.epoch)
            if pos.index >= len(order):
                pos = StreamPosition(epoch=pos.epoch + 1, index=0, taken=pos.taken)
                continue
            # Any 2·len consecutive positions hold a whole epoch, so by then every distinct id is in `out`.
            if scanned >= 2 * len(self.tasks):
                raise ConfigError(
                    f"the training set has {len(seen)} distinct task ids, fewer than the {n} one step takes "
                    "(grpo.tasks_per_step)"
                )
            task = self.tasks.task_at(order[pos.index])
            pos = StreamPosition(epoch=pos.epoch, index=pos.index + 1, taken=pos.taken + 1)
            scanned += 1
            if task.id in seen:
                continue
            seen.add(task.id)
            out.append(task)
        self.position = pos
        return out
