"""Named task sets shipped with the package (``demo``, ``default``) and how they are regenerated.

``load_preset(name)`` returns the paths of the shipped ``train.json`` / ``validation.json``; a test checks
they equal :func:`build_preset`'s output byte for byte. Regenerate with ``mcprl-tasks build-presets``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mcprl_tasks.errors import TasksError, UnknownPresetError
from mcprl_tasks.generate import generate_split, write_split
from mcprl_tasks.registry import DEMO_FAMILIES, FAMILIES
from mcprl_tasks.universe import Universe

__all__ = ["PRESETS", "Preset", "build_preset", "load_preset", "preset_dir", "write_presets"]


@dataclass(frozen=True, kw_only=True)
class Preset:
    """How a shipped task set is generated."""

    seed: int
    n_train: int
    n_val: int
    families: tuple[str, ...]
    universe: Callable[[], Universe]
    description: str


PRESETS: dict[str, Preset] = {
    "demo": Preset(
        seed=0,
        n_train=4000,
        n_val=800,
        families=DEMO_FAMILIES,
        universe=lambda: Universe.first(200, style="short"),
        description="Short prompts over 200 symbols: quote, quote_mul, quote_ratio, post_quote (for the tiny model).",
    ),
    "default": Preset(
        seed=1,
        n_train=6000,
        n_val=1200,
        families=tuple(FAMILIES),
        universe=lambda: Universe.first(40, style="natural"),
        description="Every family over all 40 fixture companies with natural prompts.",
    ),
}


def _preset(name: str) -> Preset:
    preset = PRESETS.get(name)
    if preset is None:
        raise UnknownPresetError(f"unknown preset {name!r}; choose from {', '.join(sorted(PRESETS))}")
    return preset


def build_preset(name: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Generate a preset's train and validation tasks."""
    p = _preset(name)
    return generate_split(
        seed=p.seed, n_train=p.n_train, n_val=p.n_val, families=p.families, universe=p.universe()
    )


def preset_dir(name: str) -> Path:
    """The package data directory of a preset (it may not exist yet)."""
    _preset(name)
    return Path(str(resources.files("mcprl_tasks").joinpath("data", name)))


def load_preset(name: str) -> tuple[Path, Path]:
    """Paths of a shipped preset's ``train.json`` and ``validation.json``.

    Args:
        name: ``demo`` or ``default``.

    Raises:
        UnknownPresetError: No such preset.
        TasksError: The preset's files are missing from the installed package.
    """
    directory = preset_dir(name)
    train, validation = directory / "train.json", directory / "validation.json"
    if not (train.is_file() and validation.is_file()):
        raise TasksError(f"preset {name!r} is not shipped at {directory}; run `mcprl-tasks build-presets`")
    return train, validation


def write_presets(names: list[str] | None = None) -> list[Path]:
    """Regenerate presets (all when None) into the package data directory; returns the files written."""
    written: list[Path] = []
    for name in names if names is not None else list(PRESETS):
        train, validation = build_preset(name)
        written.extend(write_split(preset_dir(name), train, validation))
    return written
