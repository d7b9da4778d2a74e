"""Raw YAML data → typed attrs configs, driven by the classes' fields, type hints and validators.

Generic over nested attrs classes, the app's sections and the libraries' own configs alike
(`mcprl_env.EnvConfig`, `mcprl_policy.LoraSettings`, ...): every field of every section is a key by
construction. Errors are `ConfigError`s that name the key path, the value and what was expected, whichever
package's validator failed; unknown keys name the nearest valid key.

Values are checked strictly (a boolean is ``true``/``false``, never ``"yes"`` or ``1``); lists become tuples
and integers become floats where the annotation says so. A class may define ``from_data(data, path)`` to
read a shape of its own (the tagged union of `mcprl_train.config.tools.ToolsConfig`).
"""

from __future__ import annotations

import datetime
import functools
import re
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin, overload

import attrs

from mcprl_train.config.layers import is_list, is_mapping, unknown_key_message
from mcprl_train.errors import ConfigError

__all__ = ["key_paths", "structure", "structure_fields"]

T = TypeVar("T")


@overload
def structure(value: object, hint: type[T], path: str) -> T: ...
@overload
def structure(value: object, hint: object, path: str) -> object: ...
def structure(value: object, hint: object, path: str) -> object:
    """Check ``value`` against the annotation ``hint`` and build the typed value (attrs classes included).

    Raises:
        ConfigError: naming ``path``, the value and what was expected.
    """
    origin = get_origin(hint)
    if isinstance(hint, type) and attrs.has(hint):
        return structure_class(value, hint, path)
    if origin in (Union, types.UnionType):
        return _structure_union(value, get_args(hint), hint, path)
    ok = _structure_leaf(value, hint, origin, path)
    if ok is _MISSING:
        raise ConfigError(f"{path}: got {value!r}; expected {_describe(hint)}")
    return ok


def structure_fields(cls: type, data: Mapping[str, object], path: str) -> dict[str, object]:
    """Typed, validated keyword arguments of ``cls`` from ``data`` (unknown keys rejected)."""
    fields = {f.name: f for f in attrs.fields(cls)}
    hints = _hints(cls)
    kwargs: dict[str, object] = {}
    for key, item in data.items():
        key_path = f"{path}.{key}" if path else str(key)
        if key not in fields:
            siblings = [f"{path}.{n}" if path else n for n in fields]
            raise ConfigError(unknown_key_message(key_path, siblings + _tree_paths()))
        kwargs[key] = _validated(fields[key], structure(item, hints[key], key_path), key_path)
    return kwargs


def key_paths(cls: type, prefix: str = "") -> Iterator[str]:
    """Every key path below ``cls`` (sections and their fields, recursively)."""
    hints = _hints(cls)
    for field in attrs.fields(cls):
        path = f"{prefix}.{field.name}" if prefix else field.name
        yield path
        for arg in (hints[field.name], *get_args(hints[field.name])):
            if isinstance(arg, type) and attrs.has(arg):
                yield from key_paths(arg, path)


def _tree_paths() -> list[str]:
    from mcprl_train.config.tree import Config  # the root of every key path; tree imports this module

    return _cached_paths(Config)


@functools.cache
def _cached_paths(cls: type) -> list[str]:
    return list(key_paths(cls))


@functools.cache
def _hints(cls: type) -> dict[str, object]:
    return typing.get_type_hints(cls)


def structure_class(value: object, cls: type[T], path: str) -> T:
    """The attrs class ``cls`` built from the config data ``value`` (see `structure`)."""
    from_data: Callable[[object, str], T] | None = getattr(cls, "from_data", None)
    if from_data is not None:
        return from_data({} if value is None else value, path)
    if value is None:
        value = {}
    if not is_mapping(value):
        raise ConfigError(f"{path}: expected a mapping of keys, got {value!r}")
    kwargs = structure_fields(cls, value, path)
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{path}: {exc}" if path else str(exc)) from exc


def _structure_union(value: object, args: tuple[object, ...], hint: object, path: str) -> object:
    if value is None and type(None) in args:
        return None
    rest = [a for a in args if a is not type(None)]
    if len(rest) == 1:  # Optional[X]: X's own error is the specific one
        return structure(value, rest[0], path)
    for arg in rest:
        try:
            return structure(value, arg, path)
        except ConfigError:
            continue
    raise ConfigError(f"{path}: got {value!r}; expected {_describe(hint)}")


def _structure_leaf(value: object, hint: object, origin: object, path: str) -> object:
    if hint is Any:
        return value
    if origin is Literal:
        return value if any(value == a and type(value) is type(a) for a in get_args(hint)) else _MISSING
    if hint is type(None):
        return value if value is None else _MISSING
    if hint is bool:
        return value if isinstance(value, bool) else _MISSING
    if hint is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _MISSING
    if hint is float:
        return _number(value)
    if hint is str:
        return value if isinstance(value, str) else _MISSING
    if hint is datetime.date:
        return _date(value)
    if origin is tuple and is_list(value):
        args = get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(structure(v, args[0], f"{path}[{i}]") for i, v in enumerate(value))
        if len(args) == len(value):
            return tuple(
                structure(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=True))
            )
    if origin is dict and is_mapping(value):
        key_t, val_t = get_args(hint)
        return {structure(k, key_t, path): structure(v, val_t, f"{path}.{k}") for k, v in value.items()}
    return _MISSING


def _date(value: object) -> object:
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value  # YAML reads an unquoted 2026-11-24 as a date
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            return _MISSING
    return _MISSING


def _number(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):  # YAML 1.1 reads "1e-5" (no dot) as a string
        try:
            return float(value)
        except ValueError:
            return _MISSING
    return _MISSING


def _validated(field: attrs.Attribute[Any], value: object, path: str) -> object:
    """Run the field's converter and validators on ``value`` alone, so a failure names its key path."""
    # attrs leaves a Converter's type parameters unbound; a plain converter takes and returns a value.
    converter = cast("Callable[[object], object] | None", field.converter)  # pyright: ignore[reportUnknownMemberType]
    if converter is not None and callable(converter):
        value = converter(value)
    for check in _leaf_validators(field.validator):
        optional = getattr(check, "validator", None) if type(check).__name__ == "_OptionalValidator" else None
        if optional is not None and value is None:
            continue
        for leaf in _leaf_validators(optional) if optional is not None else [check]:
            try:
                leaf(None, field, value)
            except ConfigError:
                raise
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"{path}: {_expectation(leaf, field.name, value, exc)}") from exc
    return value


def _leaf_validators(validator: Any) -> list[Any]:
    """The single checks of a field's validator (attrs' ``and_`` and lists flattened)."""
    if validator is None:
        return []
    if is_list(validator):
        return [leaf for v in validator for leaf in _leaf_validators(v)]
    nested: Any = getattr(validator, "_validators", None)  # attrs.validators.and_
    if nested is not None:
        return [leaf for v in nested for leaf in _leaf_validators(v)]
    return [validator]


def _expectation(validator: Any, name: str, value: Any, exc: Exception) -> str:
    op, bound = getattr(validator, "compare_op", None), getattr(validator, "bound", None)
    if op is not None:  # attrs.validators.ge/gt/le/lt
        return f"expected a value {op} {bound}, got {value!r}"
    # A validator's message usually starts with the field name, which the key path already says.
    return re.sub(rf"^'?{re.escape(name)}'?:?\s+", "", str(exc))


def _describe(hint: object) -> str:
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
    if origin is dict or (isinstance(hint, type) and attrs.has(hint)):
        return "a mapping"
    if hint is datetime.date:
        return "a date (YYYY-MM-DD)"
    names: dict[object, str] = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    return names.get(hint, str(hint))


_MISSING = object()
