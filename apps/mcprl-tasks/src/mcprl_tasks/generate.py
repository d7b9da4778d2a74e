"""Deterministic generation of train/validation task sets with held-out combinations.

For each family the combination space (e.g. every ``(symbol, multiplier)``) is shuffled with a seed-derived
RNG and split: ``val_fraction`` of the combinations (at least one) belong to validation only, the rest to
train only. Tasks are then drawn round-robin across families, each from its split's combinations, so
validation ids and combinations are disjoint from train's. Same arguments → same tasks → same bytes.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from mcprl_tasks.errors import UnknownFamilyError
from mcprl_tasks.family import Combo, Family
from mcprl_tasks.registry import FAMILIES
from mcprl_tasks.schema import make_task, write_tasks
from mcprl_tasks.universe import Universe

__all__ = ["Split", "generate_split", "generate_tasks", "split_combos", "write_split"]

Split = Literal["train", "val"]


def _rng(seed: int, *parts: str) -> random.Random:
    digest = hashlib.sha256("/".join([str(seed), *parts]).encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _family(name: str) -> Family:
    family = FAMILIES.get(name)
    if family is None:
        raise UnknownFamilyError(f"unknown task family {name!r}; choose from {', '.join(sorted(FAMILIES))}")
    return family


def split_combos(
    family: Family, universe: Universe, *, seed: int, val_fraction: float = 0.2
) -> dict[Split, list[Combo]]:
    """Split a family's combinations into disjoint train and validation sets.

    Raises:
        ValueError: The family has fewer than 2 combinations or ``val_fraction`` is outside (0, 1).
    """
    if not 0.0 < val_fraction < 1.0:
        raise ValueError("val_fraction must be in (0, 1)")
    combos = family.combos(universe)
    if len(combos) < 2:
        raise ValueError(f"family {family.name!r} has {len(combos)} combination(s); need at least 2")
    order = list(combos)
    _rng(seed, "split", family.name).shuffle(order)
    n_val = min(len(order) - 1, max(1, round(len(order) * val_fraction)))
    return {"val": order[:n_val], "train": order[n_val:]}


def generate_tasks(
    split: Split,
    n: int,
    *,
    seed: int,
    families: Sequence[str],
    universe: Universe,
    val_fraction: float = 0.2,
) -> list[dict[str, Any]]:
    """Generate ``n`` tasks of one split.

    Args:
        split: ``train`` or ``val`` (validation ids contain ``-val-``).
        n: Number of tasks.
        seed: Seed of the whole set (the split of combinations depends on it, not on ``split``).
        families: Family names, drawn round-robin.
        universe: Symbols and prompt style.
        val_fraction: Fraction of each family's combinations held out for validation.
    """
    chosen = [_family(name) for name in families]
    if not chosen:
        raise ValueError("families must not be empty")
    pools = {f.name: split_combos(f, universe, seed=seed, val_fraction=val_fraction)[split] for f in chosen}
    rng = _rng(seed, "draw", split)
    counters = dict.fromkeys(pools, 0)
    tasks: list[dict[str, Any]] = []
    for i in range(n):
        family = chosen[i % len(chosen)]
        combo = rng.choice(pools[family.name])
        draft = family.build(combo, rng, universe)
        counters[family.name] += 1
        tasks.append(
            make_task(
                task_id=f"{family.name.replace('_', '-')}-{split}-{counters[family.name]:05d}",
                prompt=draft.prompt,
                servers=draft.servers,
                difficulty=draft.difficulty,
                answer=draft.answer,
                checker=draft.checker,
                family=family.name,
                min_tool_calls=draft.min_tool_calls,
                params=draft.params,
            )
        )
    rng.shuffle(tasks)
    return tasks


def generate_split(
    *,
    seed: int,
    n_train: int,
    n_val: int,
    families: Sequence[str],
    universe: Universe,
    val_fraction: float = 0.2,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate the train and validation task lists (disjoint ids and combinations)."""
    train = generate_tasks(
        "train", n_train, seed=seed, families=families, universe=universe, val_fraction=val_fraction
    )
    validation = generate_tasks(
        "val", n_val, seed=seed, families=families, universe=universe, val_fraction=val_fraction
    )
    return train, validation


def write_split(
    out_dir: str | Path, train: list[dict[str, Any]], validation: list[dict[str, Any]]
) -> tuple[Path, Path]:
    """Write ``train.json`` and ``validation.json`` into ``out_dir``."""
    out = Path(out_dir)
    return write_tasks(out / "train.json", train), write_tasks(out / "validation.json", validation)
