"""Layers of a config: reading files, parsing ``key=value`` overrides, merging, and type-checking values.

The generic half of `mcprl_train.config`: nothing here knows the sections. `check_value` validates a raw
YAML value against a field's annotation (bool/int/float/str, ``Literal``, unions with None, tuples, dicts) and
raises a `ConfigError` naming the key path, the value and what was expected.
"""

from __future__ import annotations

import difflib
import json
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

import yaml

from mcprl_train.errors import ConfigError

__all__ = [
    "check_value",
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


def _describe(hint: Any) -> str:
    origin = get_origin(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in get_args(hint))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(hint))
    if hint is type(None):
        return "null"
    if origin is tuple:
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0])} values"
        return f"a list of {len(args)} values"
    if origin is dict:
        return "a mapping"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}.get(hint, str(hint))


def check_value(value: Any, hint: Any, path: str) -> Any:
    """Check ``value`` against the annotation ``hint``; convert lists to tuples and ints to floats."""
    origin = get_origin(hint)
    ok: Any = _MISSING
    if hint is Any:
        ok = value
    elif origin in (Union, types.UnionType):
        for arg in get_args(hint):
            try:
                return check_value(value, arg, path)
            except ConfigError:
                continue
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in get_args(hint)):
            ok = value
    elif hint is type(None):
        ok = value if value is None else _MISSING
    elif hint is bool:
        ok = value if isinstance(value, bool) else _MISSING
    elif hint is int:
        ok = value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    elif hint is float:
        ok = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else _MISSING
        if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
            try:
                ok = float(value)
            except ValueError:
                ok = _MISSING
    elif hint is str:
        ok = value if isinstance(value, str) else _MISSING
    elif origin is tuple and isinstance(value, list | tuple):
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            ok = tuple(check_value(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        elif len(args) == len(value):
            ok = tuple(
                check_value(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
            )
    elif origin is dict and isinstance(value, Mapping):
        key_t, val_t = get_args(hint)
        ok = {check_value(k, key_t, path): check_value(v, val_t, f"{path}.{k}") for k, v in value.items()}
    if ok is _MISSING:
        raise ConfigError(f"{path}: got {value!r}; expected {_describe(hint)}")
    return ok


_MISSING: Any = object()


def plain_data(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    return value
