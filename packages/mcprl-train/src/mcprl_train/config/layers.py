"""Layers of a config: reading files, parsing ``key=value`` overrides, merging them, writing plain data.

Nothing here knows the sections; `mcprl_train.config.structure` turns the merged data into typed configs.
"""

from __future__ import annotations

import datetime
import difflib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeGuard

import yaml

from mcprl_train.errors import ConfigError

__all__ = [
    "deep_merge",
    "is_dict",
    "is_list",
    "is_mapping",
    "parse_override",
    "plain_data",
    "read_config_file",
    "unknown_key_message",
]


def is_mapping(value: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether ``value`` is a mapping: a (sub)tree of config data, JSON-shaped."""
    return isinstance(value, Mapping)


def is_dict(value: object) -> TypeGuard[dict[str, Any]]:
    """Whether ``value`` is a dict: a (sub)tree of config data as YAML and JSON read it."""
    return isinstance(value, dict)


def is_list(value: object) -> TypeGuard[list[Any] | tuple[Any, ...]]:
    """Whether ``value`` is a list (or tuple) of config data, JSON-shaped."""
    return isinstance(value, list | tuple)


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
    if not is_dict(data):
        raise ConfigError(f"config file {str(path)!r}: expected a mapping at the top level")
    return data


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in over.items():
        if is_mapping(value) and is_mapping(merged.get(key)):
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


def plain_data(tree: Mapping[str, Any]) -> dict[str, Any]:
    """``tree`` as plain YAML/JSON-able data: nested dicts and lists (tuples become lists, dates ISO strings)."""
    return {k: _plain(v) for k, v in tree.items()}


def _plain(value: object) -> object:
    if is_dict(value):
        return plain_data(value)
    if is_list(value):
        return [_plain(v) for v in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value
