"""Layers of a config: reading files, parsing ``key=value`` overrides, merging them, writing plain data.

Nothing here knows the sections; `mcprl_train.config.structure` turns the merged data into typed configs.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from mcprl_train.errors import ConfigError

__all__ = [
    "deep_merge",
    "parse_override",
    "plain_data",
    "read_config_file",
    "unknown_key_message",
]


def parse_override(item: str) -> dict[str, Any]:
    """``"grpo.group_size=8"`` → ``{"grpo": {"group_size": 8}}`` (value parsed as YAML).

    Raises:
        ConfigError: no ``=`` or an empty key.
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override {item!r}: expected section.key=value, e.g. grpo.group_size=8")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
    tree: dict[str, Any] = {}
    node = tree
    *parents, leaf = key.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[leaf] = value
    return tree


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"config file {str(path)!r}: cannot read it ({exc.strerror})") from exc
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"config file {str(path)!r}: not valid {path.suffix.lstrip('.') or 'YAML'} ({exc})"
        ) from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r}: expected a mapping at the top level")
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def unknown_key_message(path: str, candidates: Sequence[str]) -> str:
    near = difflib.get_close_matches(path, candidates, n=1, cutoff=0.5)
    if not near:  # a typo in the section part: compare the last component against every field name
        leaf = path.rsplit(".", 1)[-1]
        near = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:1]
    hint = f"; did you mean {near[0]!r}?" if near else ""
    return f"unknown config key {path!r}{hint}"


def plain_data(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    return value
