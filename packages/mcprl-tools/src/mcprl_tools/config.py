"""Server configuration: the `mcpServers` format MCP clients use, plus mcprl's own keys.

```json
{"mcpServers": {
   "finance": {"command": "python", "args": ["-m", "finance_server"], "env": {"API_KEY": "${FINANCE_KEY}"},
               "call_timeout": 15, "max_concurrency": 8},
   "search":  {"url": "http://127.0.0.1:8000/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}}},
 "defaults": {"output_cap_bytes": 16384},
 "aliases": {"python_code": "code"}}
```

`${VAR}` references are expanded from the environment when the file is loaded; the values are passed only to
the server that names them and are redacted (`ServerConfig.redact`) wherever text may reach a log. A value
written literally in `env` or `headers` is a secret too when it has at least `LITERAL_SECRET_MIN_LEN` (8)
characters: shorter ones are flags (`1`, `true`) that redaction would blank out of every tool output. Each
server lists the variables it references (`ServerConfig.variables`); loading with `missing_variables="keep"`
leaves unset ones as written instead of raising, so a checker can name every missing variable at once.
"""

from __future__ import annotations

import json
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import attrs
import yaml

from mcprl_tools._config_parse import (
    LITERAL_SECRET_MIN_LEN,
    REDACTED,
    ParseContext,
    is_literal_secret,
    parse_server,
    redact_mapping,
)
from mcprl_tools.errors import ConfigError

Transport = Literal["stdio", "http", "memory"]
CatalogueChangePolicy = Literal["warn", "refuse"]
MissingVariables = Literal["raise", "keep"]
"""What an unset `${VAR}` does when loading: raise `MissingVariableError`, or stay in the value as written."""

_TOP_KEYS = ("mcpServers", "defaults", "aliases")

__all__ = [
    "LITERAL_SECRET_MIN_LEN",
    "REDACTED",
    "CatalogueChangePolicy",
    "MissingVariables",
    "RestartPolicy",
    "ServerConfig",
    "ServersConfig",
    "Transport",
    "is_literal_secret",
    "redact_mapping",
]


def _positive(_inst: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not value > 0:
        raise ValueError(f"{attribute.name} must be > 0, got {value!r}")


@attrs.frozen(kw_only=True)
class RestartPolicy:
    """How a crashed or hung server is restarted.

    Attributes:
        backoff_initial: First delay before a restart, in seconds; doubles per consecutive failure.
        backoff_max: Ceiling of the delay, in seconds.
        max_crashes: Crashes tolerated within `window` seconds; one more marks the server unavailable.
        window: Length of the crash-budget window, in seconds.
        cooldown: Seconds an unavailable server rests before it is started again with a fresh crash budget
            (calls meanwhile fail fast as `unavailable`), so a burst of crashes does not end the run.
    """

    backoff_initial: float = attrs.field(default=0.5, validator=_positive)
    backoff_max: float = attrs.field(default=30.0, validator=_positive)
    max_crashes: int = attrs.field(default=5, validator=attrs.validators.ge(0))
    window: float = attrs.field(default=300.0, validator=_positive)
    cooldown: float = attrs.field(default=60.0, validator=_positive)

    def delay(self, consecutive_failures: int) -> float:
        """Backoff delay before restart number `consecutive_failures` (1-based)."""
        return min(self.backoff_initial * 2 ** max(consecutive_failures - 1, 0), self.backoff_max)


def _redacted_mapping(value: Mapping[str, str]) -> str:
    return "{" + ", ".join(f"{k!r}: '***'" for k in value) + "}"


@attrs.frozen(kw_only=True, repr=False)
class ServerConfig:
    """One MCP server: how to reach it and how mcprl treats it.

    Attributes:
        name: Server name (the key under `mcpServers`).
        transport: `"stdio"` (command), `"http"` (streamable HTTP url) or `"memory"` (in-process, tests).
        command: Executable for stdio servers.
        args: Its arguments.
        env: Extra environment for this server only (secrets allowed; redacted in reprs).
        cwd: Working directory of the server process.
        url: Endpoint of a streamable HTTP server.
        headers: HTTP headers (secrets allowed; redacted in reprs).
        call_timeout: Caller-side deadline of one tool call, in seconds.
        start_timeout: Deadline for spawn + initialize + list tools, in seconds.
        ping_timeout: Deadline of a health ping, in seconds.
        max_concurrency: Calls in flight on this server at most.
        restart: Restart policy after crashes and hangs.
        allow_tools: If set, only these tools are exposed.
        deny_tools: Tools never exposed.
        output_cap_bytes: Tool output shown to the model, in UTF-8 bytes, before truncation.
        optional: Continue without this server if it cannot start.
        aliases: Argument aliases for this server's tools (`alias -> canonical`).
        on_catalogue_change: What to do when the tool catalogue changes mid-run.
        health_interval: Seconds between background health pings, or None for on-demand only.
        stateful: The server keeps state between calls (per episode) that a restart loses; an episode that
            used it across a restart is then invalid. True by default: wrongly assuming statelessness
            mis-scores episodes silently, wrongly assuming state only costs a retry of the affected ones.
        max_argument_bytes: Largest UTF-8 JSON encoding of one call's arguments; larger calls are rejected
            as the model's fault before they reach the server.
        secrets: Values expanded from `${VAR}` references and literal `env`/`headers` values of at least
            `LITERAL_SECRET_MIN_LEN` characters, redacted by `redact`.
        variables: Names of the environment variables its `${VAR}` references read, set or not.
    """

    name: str
    transport: Transport
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = attrs.field(factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = attrs.field(factory=dict)
    call_timeout: float = attrs.field(default=15.0, validator=_positive)
    start_timeout: float = attrs.field(default=30.0, validator=_positive)
    ping_timeout: float = attrs.field(default=5.0, validator=_positive)
    max_concurrency: int = attrs.field(default=8, validator=attrs.validators.ge(1))
    restart: RestartPolicy = attrs.field(factory=RestartPolicy)
    allow_tools: tuple[str, ...] | None = None
    deny_tools: tuple[str, ...] = ()
    output_cap_bytes: int = attrs.field(default=16384, validator=attrs.validators.ge(64))
    optional: bool = False
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    on_catalogue_change: CatalogueChangePolicy = "warn"
    health_interval: float | None = None
    stateful: bool = True
    max_argument_bytes: int = attrs.field(default=1 << 20, validator=attrs.validators.ge(64))
    secrets: frozenset[str] = attrs.field(factory=frozenset)
    variables: frozenset[str] = attrs.field(factory=frozenset)

    def __attrs_post_init__(self) -> None:
        match self.transport:
            case "stdio":
                if not self.command:
                    raise ValueError(f"server {self.name!r}: stdio transport needs a command")
            case "http":
                if not self.url:
                    raise ValueError(f"server {self.name!r}: http transport needs a url")
            case "memory":
                pass

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{f.name}={_redacted_mapping(v) if f.name in ('env', 'headers') else repr(v)}"
            for f in attrs.fields(type(self))
            if f.name != "secrets" and (v := getattr(self, f.name)) != f.default
        )
        return self.redact(f"ServerConfig({fields})")

    def redact(self, text: str) -> str:
        """Replace every secret value of this server in `text` with `***`."""
        for secret in sorted(self.secrets, key=len, reverse=True):
            if secret:
                text = text.replace(secret, REDACTED)
        return text

    def redact_json(self, value: object) -> object:
        """`value` (JSON-like) with every secret in its strings replaced by `***`."""
        if value is None or not self.secrets:
            return value
        encoded = json.dumps(value, ensure_ascii=False)
        if not any(json.dumps(s, ensure_ascii=False)[1:-1] in encoded for s in self.secrets if s):
            return value
        for secret in sorted(self.secrets, key=len, reverse=True):
            if secret:
                encoded = encoded.replace(json.dumps(secret, ensure_ascii=False)[1:-1], REDACTED)
        return json.loads(encoded)

    def exposes(self, tool: str) -> bool:
        """Whether the allow/deny lists let `tool` through."""
        if tool in self.deny_tools:
            return False
        return self.allow_tools is None or tool in self.allow_tools


@attrs.frozen(kw_only=True)
class ServersConfig:
    """All servers a manager runs, plus global argument aliases.

    Attributes:
        servers: Server configs by name, in file order.
        aliases: Argument aliases applied to every tool (`alias -> canonical`); per-server ones win.
        source: Where the config came from (file path or `<inline>`), used in error messages.
    """

    servers: Mapping[str, ServerConfig]
    aliases: Mapping[str, str] = attrs.field(factory=dict)
    source: str = "<inline>"

    @classmethod
    def load(
        cls,
        path: str | os.PathLike[str],
        *,
        environ: Mapping[str, str] | None = None,
        missing_variables: MissingVariables = "raise",
    ) -> ServersConfig:
        """Read a JSON, YAML or TOML file holding `{"mcpServers": {...}}` (see `from_dict`).

        Raises:
            ConfigError: Unreadable file, invalid structure, unknown key, or missing `${VAR}`.
        """
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{p}: cannot read servers config: {exc}") from exc
        try:
            match p.suffix.lower():
                case ".yaml" | ".yml":
                    data = yaml.safe_load(text)
                case ".toml":
                    data = tomllib.loads(text)
                case _:
                    data = json.loads(text)
        except (ValueError, yaml.YAMLError) as exc:
            raise ConfigError(f"{p}: not valid {p.suffix.lstrip('.') or 'json'}: {exc}") from exc
        return cls.from_dict(data, source=str(p), environ=environ, missing_variables=missing_variables)

    @classmethod
    def from_dict(
        cls,
        data: object,
        *,
        source: str = "<inline>",
        environ: Mapping[str, str] | None = None,
        missing_variables: MissingVariables = "raise",
    ) -> ServersConfig:
        """Build from the parsed `{"mcpServers": {...}}` structure.

        Args:
            data: The parsed structure.
            source: Where it came from, for error messages.
            environ: Where `${VAR}` references are looked up (default `os.environ`).
            missing_variables: `"raise"` on an unset `${VAR}`, or `"keep"` the reference as written (the
                servers then describe the file but cannot start; for checks that name what is missing).

        Raises:
            ConfigError: Invalid structure, unknown key (with the nearest valid one), or missing `${VAR}`.
        """
        ctx = ParseContext(
            source=source,
            environ=os.environ if environ is None else environ,
            missing_variables=missing_variables,
        )
        top = ctx.mapping(data, where="top level", expected='an object with "mcpServers"')
        ctx.reject_unknown(top, _TOP_KEYS, where="top level")
        if "mcpServers" not in top:
            raise ConfigError(
                f'{source}: top level: missing key "mcpServers" (expected an object of servers)'
            )
        servers_raw = ctx.mapping(
            top["mcpServers"], where='key "mcpServers"', expected="an object of servers"
        )
        defaults = ctx.mapping(top.get("defaults", {}), where='key "defaults"', expected="an object")
        aliases = ctx.str_mapping(top.get("aliases", {}), where='key "aliases"')
        servers: dict[str, ServerConfig] = {}
        for name, raw in servers_raw.items():
            parsed = parse_server(ctx, str(name), raw, defaults)
            if parsed is not None:
                servers[str(name)] = ServerConfig(**parsed)
        return cls(servers=servers, aliases=aliases, source=source)

    def aliases_for(self, server: str) -> dict[str, str]:
        """Global aliases overlaid with the server's own."""
        return {**self.aliases, **self.servers[server].aliases}
