"""Raw YAML data → typed attrs configs: cattrs, with strict leaves and errors that name the key path.

cattrs walks the nested attrs classes (the app's sections and the libraries' own configs alike,
`mcprl_env.EnvConfig`, `mcprl_policy.LoraSettings`, ...), so every field of every section is a key by
construction. The hooks here make the leaves strict (a boolean is ``true``/``false``, never ``"yes"`` or ``1``;
lists become tuples; integers, and strings such as ``"1e-5"`` that YAML 1.1 reads as strings, become floats where
the annotation says so) and run each field's validators on its value alone, so a failure names its key. cattrs'
error tree becomes one `ConfigError` naming the key path, the value and what was expected; an unknown key names
the nearest valid key. A class may define ``from_data(data)`` to read a shape of its own (the tagged union of
`mcprl_train.config.tools.ToolsConfig`), raising `Invalid`, `UnknownKey` or `Nested` for what it refuses.
"""

from __future__ import annotations

import datetime
import functools
import re
import types
import typing
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal, TypeVar, Union, cast, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from mcprl_train.config.layers import is_list, is_mapping, unknown_key_message
from mcprl_train.errors import ConfigError

__all__ = ["Invalid", "Nested", "UnknownKey", "key_paths", "structure", "structure_at"]

T = TypeVar("T")
_Hook = Callable[[Any, Any], object]


class Invalid(ValueError):
    """A value that does not fit: ``str(error)`` is reported after its key path."""


class UnknownKey(ValueError):
    """``key`` is not one of ``candidates`` (keys relative to the mapping that holds them)."""

    def __init__(self, key: str, candidates: Sequence[str]) -> None:
        super().__init__(key)
        self.key, self.candidates = key, candidates


class Nested(ValueError):
    """``error`` was raised structuring the value at ``sub`` below the key path (``.servers``, ``[0]``)."""

    def __init__(self, sub: str, error: Exception) -> None:
        super().__init__(sub)
        self.sub, self.error = sub, error


def structure(value: object, hint: type[T], path: str) -> T:
    """``value`` checked against ``hint`` and built (attrs classes included).

    Raises:
        ConfigError: naming ``path`` (plus the key below it), the value and what was expected.
    """
    try:
        return _converter.structure(value, hint)
    except (ValueError, TypeError, cattrs.BaseValidationError) as exc:
        raise _config_error(exc, path) from exc


def key_paths(cls: type, prefix: str = "") -> Iterator[str]:
    """Every key path below ``cls`` (sections and their fields, recursively)."""
    hints = _hints(cls)
    for field in attrs.fields(cls):
        path = _join(prefix, field.name)
        yield path
        for arg in (hints[field.name], *get_args(hints[field.name])):
            if isinstance(arg, type) and attrs.has(arg):
                yield from key_paths(arg, path)


def _config_error(exc: BaseException, path: str) -> ConfigError:
    match exc:
        case ConfigError():
            return exc
        case Nested(sub=sub, error=error):
            return _config_error(error, path + sub)
        case UnknownKey(key=key, candidates=candidates):
            return ConfigError(unknown_key_message(_join(path, key), [_join(path, c) for c in candidates]))
        case ForbiddenExtraKeysError(cl=cls, extra_fields=extra):
            siblings = [_join(path, f.name) for f in attrs.fields(cls)]
            return ConfigError(unknown_key_message(_join(path, sorted(extra)[0]), siblings + _tree_paths()))
        case ClassValidationError():
            noted, plain = exc.group_exceptions()
            if noted:
                return _config_error(noted[0][0], _join(path, noted[0][1].name))
            return _config_error(plain[0], path)
        case _:  # an error raised by a class itself (``__attrs_post_init__``)
            return ConfigError(f"{path}: {exc}" if path else str(exc))


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _tree_paths() -> list[str]:
    from mcprl_train.config.tree import Config  # the root of every key path; tree imports this module

    return _cached_paths(Config)


@functools.cache
def _cached_paths(cls: type) -> list[str]:
    return list(key_paths(cls))


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _attrs_hook(cls: type) -> _Hook:
    from_data: Callable[[object], object] | None = getattr(cls, "from_data", None)
    if from_data is not None:
        return lambda value, _: from_data({} if value is None else value)
    fields: dict[str, Any] = {  # make_dict_structure_fn's **kwargs are the per-attribute overrides
        f.name: override(struct_hook=functools.partial(_field, f, _hints(cls)[f.name]))
        for f in attrs.fields(cls)
    }
    build: _Hook = make_dict_structure_fn(
        cast("type[object]", cls), _converter, _cattrs_forbid_extra_keys=True, **fields
    )

    def hook(value: object, _: object) -> object:
        if value is None:
            value = {}
        if not is_mapping(value):
            raise Invalid(f"expected a mapping of keys, got {value!r}")
        return build(value, cls)

    return hook


def _field(field: attrs.Attribute[Any], hint: object, value: object, _: object) -> object:
    """The field's value structured, then its converter and validators run on it alone."""
    value = _structure(value, hint)
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
                raise Invalid(_expectation(leaf, field.name, value, exc)) from exc
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


def _invalid(value: object, hint: object) -> Invalid:
    return Invalid(f"got {value!r}; expected {_describe(hint)}")


def _leaf(fits: Callable[[object], bool]) -> _Hook:
    def hook(value: object, hint: object) -> object:
        if fits(value):
            return value
        raise _invalid(value, hint)

    return hook


def _number(value: object, hint: object) -> float:
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            pass
    raise _invalid(value, hint)


def _date(value: object, hint: object) -> datetime.date:
    if isinstance(value, datetime.date) and not isinstance(value, datetime.datetime):
        return value  # YAML reads an unquoted 2026-11-24 as a date
    if isinstance(value, str):
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            pass
    raise _invalid(value, hint)


def _literal(value: object, hint: object) -> object:
    if any(value == a and type(value) is type(a) for a in get_args(hint)):
        return value
    raise _invalid(value, hint)


def _union(value: object, hint: object) -> object:
    args = get_args(hint)
    if value is None and type(None) in args:
        return None
    rest = [a for a in args if a is not type(None)]
    if len(rest) == 1:  # Optional[X]: X's own error is the specific one
        return _structure(value, rest[0])
    for arg in rest:
        try:
            return _structure(value, arg)
        except (ValueError, TypeError, cattrs.BaseValidationError):
            continue
    raise _invalid(value, hint)


def _tuple(value: object, hint: object) -> tuple[object, ...]:
    args = get_args(hint)
    if not is_list(value) or (args[-1] is not Ellipsis and len(args) != len(value)):
        raise _invalid(value, hint)
    kinds = [args[0]] * len(value) if args[-1] is Ellipsis else args
    return tuple(
        structure_at(v, kind, f"[{i}]") for i, (v, kind) in enumerate(zip(value, kinds, strict=True))
    )


def _dict(value: object, hint: object) -> dict[object, object]:
    if not is_mapping(value):
        raise _invalid(value, hint)
    key_t, val_t = get_args(hint)
    return {structure_at(k, key_t, ""): structure_at(v, val_t, f".{k}") for k, v in value.items()}


def structure_at(value: object, hint: Any, sub: str) -> Any:
    """Inside a hook (``from_data``): ``value`` structured; an error is reported at ``sub`` below the key path."""
    try:
        return _structure(value, hint)
    except (ValueError, TypeError, cattrs.BaseValidationError) as exc:
        raise Nested(sub, exc) from exc


def _structure(value: object, hint: object) -> object:
    return _converter.structure(value, cast("type[object]", hint))


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


_converter = cattrs.Converter(detailed_validation=True)
_converter.register_structure_hook(bool, _leaf(lambda v: isinstance(v, bool)))
_converter.register_structure_hook(int, _leaf(lambda v: isinstance(v, int) and not isinstance(v, bool)))
_converter.register_structure_hook(str, _leaf(lambda v: isinstance(v, str)))
_converter.register_structure_hook(type(None), _leaf(lambda v: v is None))
_converter.register_structure_hook(float, _number)
_converter.register_structure_hook(datetime.date, _date)
_converter.register_structure_hook_func(lambda t: get_origin(t) is Literal, _literal)
_converter.register_structure_hook_func(lambda t: get_origin(t) in (Union, types.UnionType), _union)
_converter.register_structure_hook_func(lambda t: get_origin(t) is tuple, _tuple)
_converter.register_structure_hook_func(lambda t: get_origin(t) is dict, _dict)
_converter.register_structure_hook_factory(attrs.has, _attrs_hook)
