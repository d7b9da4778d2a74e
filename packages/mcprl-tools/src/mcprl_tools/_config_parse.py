"""Checked parsing of one `mcpServers` entry into `ServerConfig` keyword arguments.

Every error names the source file, the server, the key and what was expected; unknown keys suggest the
nearest valid key (difflib).
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from mcprl_tools.errors import ConfigError, MissingVariableError

if TYPE_CHECKING:
    from mcprl_tools.config import MissingVariables

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")

LITERAL_SECRET_MIN_LEN = 8
"""A literal ``env``/``headers`` value this long or longer is a secret; shorter ones are flags (``1``,
``true``, ``info``) that redaction would blank out of every tool output without hiding anything."""

REDACTED = "***"
"""What a secret is replaced with wherever mcprl writes or prints it."""


def is_literal_secret(value: str) -> bool:
    """Whether an ``env``/``headers`` value written literally (no ``${VAR}``) is treated as a secret."""
    return _VAR.search(value) is None and len(value) >= LITERAL_SECRET_MIN_LEN


def redact_mapping(values: Mapping[str, str]) -> dict[str, str]:
    """``values`` with every literal secret replaced by `REDACTED` (``${VAR}`` references stay as written)."""
    return {k: REDACTED if is_literal_secret(v) else v for k, v in values.items()}


SERVER_KEYS = (
    "type",
    "transport",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "disabled",
    "call_timeout",
    "start_timeout",
    "ping_timeout",
    "max_concurrency",
    "restart",
    "allow_tools",
    "deny_tools",
    "output_cap_bytes",
    "optional",
    "aliases",
    "on_catalogue_change",
    "health_interval",
    "stateful",
    "max_argument_bytes",
)
DEFAULTABLE_KEYS = SERVER_KEYS[9:]
RESTART_KEYS = ("backoff_initial", "backoff_max", "max_crashes", "window", "cooldown")
_TRANSPORT_NAMES = {
    "stdio": "stdio",
    "http": "http",
    "streamable-http": "http",
    "streamable_http": "http",
    "streamableHttp": "http",
}


@attrs.define
class ParseContext:
    """Source name and environment for one config being parsed."""

    source: str
    environ: Mapping[str, str]
    missing_variables: MissingVariables = "raise"

    def fail(self, where: str, message: str) -> ConfigError:
        return ConfigError(f"{self.source}: {where}: {message}")

    def mapping(self, value: object, *, where: str, expected: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            raise self.fail(where, f"expected {expected}, got {type(value).__name__}")
        return {str(k): v for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]

    def str_mapping(self, value: object, *, where: str) -> dict[str, str]:
        raw = self.mapping(value, where=where, expected="an object of strings")
        for key, item in raw.items():
            if not isinstance(item, str):
                raise self.fail(f'{where}, key "{key}"', f"expected a string, got {type(item).__name__}")
        return raw

    def reject_unknown(self, raw: Mapping[str, Any], valid: Iterable[str], *, where: str) -> None:
        valid = tuple(valid)
        for key in raw:
            if key not in valid:
                near = difflib.get_close_matches(key, valid, n=1, cutoff=0.5)
                hint = f'; did you mean "{near[0]}"?' if near else f"; valid keys: {', '.join(valid)}"
                raise self.fail(where, f'unknown key "{key}"{hint}')

    def expand(self, text: str, *, where: str, secrets: set[str], variables: set[str]) -> str:
        """Expand `${VAR}` references; record the names in `variables`, the expanded values in `secrets`."""

        def sub(reference: re.Match[str]) -> str:
            var = reference.group(1)
            variables.add(var)
            if var in self.environ:
                value = self.environ[var]
                secrets.add(value)
                return value
            match self.missing_variables:
                case "keep":
                    return reference.group(0)
                case "raise":
                    raise MissingVariableError(
                        f"{self.source}: {where}: environment variable ${{{var}}} is not set "
                        f"(set it in the environment of the process that starts the manager)"
                    )

        return _VAR.sub(sub, text)


def _number(ctx: ParseContext, where: str, value: object, *, integer: bool) -> float | int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (integer and not isinstance(value, int))
    ):
        kind = "an integer" if integer else "a number"
        raise ctx.fail(where, f"expected {kind}, got {value!r}")
    if value <= 0 and not (integer and value == 0):
        raise ctx.fail(where, f"expected a positive value, got {value!r}")
    return value


def _string_list(ctx: ParseContext, where: str, value: object) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):  # pyright: ignore[reportUnknownVariableType]
        raise ctx.fail(where, f"expected a list of strings, got {value!r}")
    return list(value)  # pyright: ignore[reportUnknownArgumentType]


def _parse_restart(ctx: ParseContext, where: str, value: object) -> dict[str, Any]:
    from mcprl_tools.config import RestartPolicy

    raw = ctx.mapping(value, where=where, expected="an object")
    ctx.reject_unknown(raw, RESTART_KEYS, where=where)
    out = {k: _number(ctx, f'{where}, key "{k}"', v, integer=k == "max_crashes") for k, v in raw.items()}
    return {"restart": RestartPolicy(**out)}  # pyright: ignore[reportArgumentType]


def _parse_option(ctx: ParseContext, where: str, key: str, value: object) -> dict[str, Any]:
    at = f'{where}, key "{key}"'
    match key:
        case "call_timeout" | "start_timeout" | "ping_timeout" | "health_interval":
            return {key: float(_number(ctx, at, value, integer=False))}
        case "max_concurrency" | "output_cap_bytes" | "max_argument_bytes":
            n = _number(ctx, at, value, integer=True)
            minimum = 1 if key == "max_concurrency" else 64
            if n < minimum:
                raise ctx.fail(at, f"expected an integer >= {minimum}, got {n!r}")
            return {key: int(n)}
        case "restart":
            return _parse_restart(ctx, at, value)
        case "allow_tools" | "deny_tools":
            return {key: tuple(_string_list(ctx, at, value))}
        case "optional" | "stateful":
            if not isinstance(value, bool):
                raise ctx.fail(at, f"expected true or false, got {value!r}")
            return {key: value}
        case "aliases":
            return {key: ctx.str_mapping(value, where=at)}
        case "on_catalogue_change":
            if value not in ("warn", "refuse"):
                raise ctx.fail(at, f'expected "warn" or "refuse", got {value!r}')
            return {key: value}
        case _:
            raise ctx.fail(at, "not an option")


def _parse_transport(ctx: ParseContext, where: str, raw: Mapping[str, Any]) -> str:
    declared = raw.get("type", raw.get("transport"))
    if declared is not None:
        if declared not in _TRANSPORT_NAMES:
            raise ctx.fail(
                f'{where}, key "type"', f"expected one of {', '.join(_TRANSPORT_NAMES)}, got {declared!r}"
            )
        transport = _TRANSPORT_NAMES[declared]
    elif "command" in raw:
        transport = "stdio"
    elif "url" in raw:
        transport = "http"
    else:
        raise ctx.fail(where, 'expected a "command" (stdio server) or a "url" (streamable HTTP server)')
    needed = "command" if transport == "stdio" else "url"
    if needed not in raw:
        raise ctx.fail(where, f'missing key "{needed}" required by transport {transport}')
    wrong = ("url", "headers") if transport == "stdio" else ("command", "args", "env", "cwd")
    for key in wrong:
        if key in raw:
            raise ctx.fail(f'{where}, key "{key}"', f"not valid for a {transport} server")
    return transport


def parse_server(
    ctx: ParseContext, name: str, value: object, defaults: Mapping[str, Any]
) -> dict[str, Any] | None:
    """Turn one `mcpServers` entry into `ServerConfig` kwargs; None when `disabled`."""
    where = f'server "{name}"'
    raw = ctx.mapping(value, where=where, expected="an object")
    ctx.reject_unknown(raw, SERVER_KEYS, where=where)
    ctx.reject_unknown(defaults, DEFAULTABLE_KEYS, where='key "defaults"')
    if raw.get("disabled") is True:
        return None
    transport = _parse_transport(ctx, where, raw)
    secrets: set[str] = set()
    variables: set[str] = set()
    out: dict[str, Any] = {"name": name, "transport": transport}
    for key, val in {**defaults, **raw}.items():
        at = f'{where}, key "{key}"'
        match key:
            case "type" | "transport" | "disabled":
                continue
            case "command" | "cwd" | "url":
                if not isinstance(val, str) or not val:
                    raise ctx.fail(at, f"expected a non-empty string, got {val!r}")
                out[key] = ctx.expand(val, where=at, secrets=secrets, variables=variables)
            case "args":
                out[key] = tuple(
                    ctx.expand(a, where=at, secrets=secrets, variables=variables)
                    for a in _string_list(ctx, at, val)
                )
            case "env" | "headers":
                written = ctx.str_mapping(val, where=at)
                secrets.update(v for v in written.values() if is_literal_secret(v))
                out[key] = {
                    k: ctx.expand(v, where=f'{at}, "{k}"', secrets=secrets, variables=variables)
                    for k, v in written.items()
                }
            case _:
                out.update(_parse_option(ctx, where, key, val))
    out["secrets"] = frozenset(secrets)
    out["variables"] = frozenset(variables)
    return out
