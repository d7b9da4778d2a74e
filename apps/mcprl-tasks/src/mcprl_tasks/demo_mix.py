"""Which tasks of a seeded order get a warm-start demonstration, and from which teacher.

A warm start takes ``n`` tasks from a seeded order of the training set. Taken as they come, each family gets
demonstrations in proportion to its share of the set. :func:`plan_demos` can instead give each family a share
by weight (a family that is harder to imitate, such as a two-ticker ratio, gets more examples), and say per
family which fraction of its demonstrations comes from the imperfect teacher.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from mcprl_tasks.errors import TasksError
from mcprl_tasks.registry import FAMILIES

__all__ = ["PlannedDemo", "family_quotas", "plan_demos"]


@dataclass(frozen=True)
class PlannedDemo:
    """One demonstration to write: the task's position in the order and the teacher's noise for it."""

    position: int
    teacher_noise: float


def family_quotas(available: Mapping[str, int], n: int, weights: Mapping[str, float]) -> dict[str, int]:
    """How many of ``n`` demonstrations each family gets: shares proportional to ``weights``.

    A family that ``weights`` does not name has weight 1. Shares are rounded by the largest remainder
    (Hamilton's method), ties to the family listed first in ``available``, so the quotas sum to ``n``.

    Args:
        available: Tasks per family, in the order of first appearance.
        n: Demonstrations to plan (at most the tasks available in all).
        weights: Relative weight per family, each >= 0.

    Raises:
        TasksError: ``weights`` names a family that ``available`` lacks, a weight is negative or not
            finite, every weight is 0, or a family's quota exceeds its tasks.
    """
    unknown = sorted(set(weights) - set(available))
    if unknown:
        raise TasksError(
            f"demonstration weights name {', '.join(map(repr, unknown))}, which no training task with a "
            f"demonstration belongs to (families: {', '.join(available)})"
        )
    for family, weight in weights.items():
        if not (math.isfinite(weight) and weight >= 0):
            raise TasksError(
                f"the demonstration weight of {family!r} must be a finite number >= 0, got {weight}"
            )
    w = {family: float(weights.get(family, 1.0)) for family in available}
    total = sum(w.values())
    if total <= 0:
        raise TasksError("every family's demonstration weight is 0: no demonstration to write")
    exact = {family: n * weight / total for family, weight in w.items()}
    quotas = {family: math.floor(x) for family, x in exact.items()}
    order = list(available)
    by_remainder = sorted(order, key=lambda f: (-(exact[f] - quotas[f]), order.index(f)))
    for family in by_remainder[: n - sum(quotas.values())]:
        quotas[family] += 1
    short = {f: (q, available[f]) for f, q in quotas.items() if q > available[f]}
    if short:
        detail = "; ".join(f"{f!r}: {q} asked, {a} tasks" for f, (q, a) in short.items())
        raise TasksError(f"the demonstration mix asks for more tasks than a family has ({detail})")
    return quotas


def plan_demos(
    families: Sequence[str],
    n: int,
    *,
    teacher_noise: float,
    weights: Mapping[str, float] | None = None,
    noise_by_family: Mapping[str, float] | None = None,
) -> list[PlannedDemo]:
    """The demonstrations to write for tasks in a seeded order whose families are ``families``.

    Without ``weights`` the first ``n`` tasks are taken as they come. With them, each family's first
    `family_quotas` tasks, kept in the order's own interleaving. Each gets the teacher noise of its family
    (``noise_by_family``, else ``teacher_noise``): the chance that the imperfect teacher writes it.

    A bundled family (`mcprl_tasks.registry.FAMILIES`) that ``weights`` or ``noise_by_family`` names and no
    task here belongs to has nothing to write: its setting is skipped (a profile's setting for the demo's
    two-ticker family stays harmless when a run trains on other families). Any other name is an error.

    Raises:
        TasksError: a weight or noise names a family that is neither bundled nor in ``families``, a noise is
            outside [0, 1], or `family_quotas` refuses the weights.
    """
    available = Counter(families)
    noise = _present(noise_by_family or {}, available)
    weights = _present(weights or {}, available)
    unknown = sorted(set(noise) - set(available))
    if unknown:
        raise TasksError(
            f"teacher noise names {', '.join(map(repr, unknown))}, which no training task with a "
            f"demonstration belongs to (families: {', '.join(available)})"
        )
    for family, p in {**noise, "": teacher_noise}.items():
        if not 0.0 <= p <= 1.0:
            where = f"of {family!r} " if family else ""
            raise TasksError(f"the teacher noise {where}must be in [0, 1], got {p}")
    if weights:
        quotas = family_quotas(dict(available), min(n, len(families)), weights)
        taken: Counter[str] = Counter()
        positions: list[int] = []
        for i, family in enumerate(families):
            if taken[family] < quotas[family]:
                taken[family] += 1
                positions.append(i)
    else:
        positions = list(range(min(n, len(families))))
    return [PlannedDemo(i, noise.get(families[i], teacher_noise)) for i in positions]


def _present(named: Mapping[str, float], available: Counter[str]) -> dict[str, float]:
    """``named`` without the bundled families that no task of ``available`` belongs to."""
    return {family: v for family, v in named.items() if family in available or family not in FAMILIES}
