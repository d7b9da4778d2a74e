"""The ``tools`` section: where the MCP servers come from (a tagged union), allow-lists, record and replay."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, cast

import attrs
from attrs import validators as v

from mcprl_servers.config import SERVER_NAMES
from mcprl_train.config.layers import is_dict, unknown_key_message
from mcprl_train.config.structure import structure
from mcprl_train.errors import ConfigError

__all__ = [
    "SOURCE_KEYS",
    "InlineServers",
    "OfflineServers",
    "ServersFile",
    "ToolSource",
    "ToolsConfig",
]

_SECRET_KEYS = ("env", "headers")


@attrs.frozen(kw_only=True)
class ServersFile:
    """An ``{"mcpServers": {...}}`` file (JSON/YAML/TOML; `mcprl_tools.ServersConfig.load`): ``tools.servers``."""

    path: str = attrs.field(validator=v.min_len(1))


@attrs.frozen(kw_only=True)
class InlineServers:
    """The ``mcpServers`` mapping inline (name → ``{"command", "args", "env", ...}``): ``tools.mcp_servers``.

    ``${VAR}`` in values refers to environment variables. Secrets written literally in ``env``/``headers``
    are never saved: the run's ``config.yaml`` holds ``***`` in their place (see `redacted`), and resuming
    such a run asks for them again (`require_secrets`).
    """

    servers: dict[str, Any]

    def _secret_maps(self) -> Iterator[tuple[str, str, dict[str, object]]]:
        """``(server, "env" | "headers", mapping)`` for each such mapping of a server."""
        for name, server in self.servers.items():
            if not isinstance(server, dict):
                continue
            for key in _SECRET_KEYS:
                values = cast(dict[str, object], server).get(key)
                if isinstance(values, dict):
                    yield name, key, cast(dict[str, object], values)

    def literal_secrets(self) -> frozenset[str]:
        """Every value written literally in a server's ``env``/``headers`` that `redacted` hides."""
        from mcprl_tools.config import is_literal_secret

        return frozenset(
            value
            for _, _, values in self._secret_maps()
            for value in values.values()
            if isinstance(value, str) and is_literal_secret(value)
        )

    def redacted(self) -> dict[str, Any]:
        """`servers` with each literal secret in ``env``/``headers`` replaced by ``***``."""
        from mcprl_tools.config import redact_mapping

        out: dict[str, Any] = {
            name: dict(cast(dict[str, object], server)) if isinstance(server, dict) else server
            for name, server in self.servers.items()
        }
        for name, key, values in self._secret_maps():
            out[name][key] = redact_mapping(cast(dict[str, str], values))
        return out

    def require_secrets(self) -> None:
        """Refuse a ``***`` left by `redacted` in a resumed run's config: the secret must be given again.

        Raises:
            ConfigError: naming the key and the ``--set`` that gives it.
        """
        from mcprl_tools.config import REDACTED

        for name, key, values in self._secret_maps():
            for var, value in values.items():
                if value == REDACTED:
                    raise ConfigError(
                        f"tools.mcp_servers.{name}.{key}.{var}: the value is {REDACTED} because secrets written "
                        "literally are never saved in the run directory; give it again with "
                        f"--set tools.mcp_servers.{name}.{key}.{var}=VALUE, or write it as ${{VAR}} in the config"
                    )


@attrs.frozen(kw_only=True)
class OfflineServers:
    """Bundled offline servers by name (`mcprl_servers.config.default_servers_config`): ``tools.offline``."""

    names: tuple[str, ...] = SERVER_NAMES


ToolSource = ServersFile | InlineServers | OfflineServers
"""Where the MCP servers come from; in the config tree, the key that is set says which."""

SOURCE_KEYS: dict[str, tuple[type[ToolSource], str, object]] = {
    "servers": (ServersFile, "path", str),
    "mcp_servers": (InlineServers, "servers", dict[str, Any]),
    "offline": (OfflineServers, "names", tuple[str, ...]),
}
"""The tree's key of each source → (its class, the field the value fills, the value's type)."""


@attrs.frozen(kw_only=True)
class ToolsConfig:
    """Which MCP servers the episodes talk to: exactly one source, and optional allow-lists.

    In the config tree the source is one of the keys ``servers`` (a file), ``mcp_servers`` (inline) or
    ``offline`` (bundled names); none given means every bundled offline server.

    Attributes:
        source: The tagged source.
        allow_tools: Per-server allow-lists applied on top of any source (server → exposed tool names; servers
            not named expose every tool). Fewer tools make shorter prompts for small models.
        record: Write every tool call that reaches a server, and its result, to this cassette (JSON lines,
            `mcprl_tools.cassette`); a relative path lands in the run directory.
        replay: Serve every tool call from this cassette (a relative path is read from the working
            directory); no server is started. Calls it does not hold make their episodes invalid and are
            listed in the run directory's ``replay_misses.jsonl``.
    """

    source: ToolSource = attrs.field(factory=OfflineServers)
    allow_tools: dict[str, tuple[str, ...]] = attrs.field(factory=dict[str, tuple[str, ...]])
    record: str | None = None
    replay: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.record is not None and self.replay is not None:
            raise ConfigError(
                f"tools.record ({self.record!r}) and tools.replay ({self.replay!r}) are exclusive: a replayed "
                "run starts no server to record (set one of them to null)"
            )

    @classmethod
    def from_data(cls, data: object, path: str) -> ToolsConfig:
        """Read the tree's shape (``servers`` / ``mcp_servers`` / ``offline``, ``allow_tools``).

        Raises:
            ConfigError: an unknown key, a wrong value, or more than one source.
        """
        if not is_dict(data):
            raise ConfigError(f"{path}: expected a mapping of keys, got {data!r}")
        keys = [*SOURCE_KEYS, "allow_tools", "record", "replay"]
        for key in data:
            if key not in keys:
                raise ConfigError(unknown_key_message(f"{path}.{key}", [f"{path}.{k}" for k in keys]))
        given = [k for k in SOURCE_KEYS if data.get(k) is not None]
        if len(given) > 1:
            raise ConfigError(
                f"{path}.servers/mcp_servers/offline: expected one tools source, got {given} "
                "(set the others to null)"
            )
        source: ToolSource = OfflineServers()
        if given:
            kind, field, hint = SOURCE_KEYS[given[0]]
            value: Any = structure(data[given[0]], hint, f"{path}.{given[0]}")  # typed by the table's hint
            source = kind(**{field: value})
        allow = structure(data.get("allow_tools") or {}, dict[str, tuple[str, ...]], f"{path}.allow_tools")
        record, replay = (_optional_path(data.get(key), f"{path}.{key}") for key in ("record", "replay"))
        return cls(source=source, allow_tools=allow, record=record, replay=replay)

    def to_data(self, *, redact: bool = False) -> dict[str, Any]:
        """The tree's shape of this section (what `from_data` reads); ``redact``: see `InlineServers.redacted`."""
        match self.source:
            case ServersFile(path=path):
                data: dict[str, Any] = {"servers": path}
            case InlineServers(servers=servers) as inline:
                data = {"mcp_servers": inline.redacted() if redact else dict(servers)}
            case OfflineServers(names=names):
                data = {"offline": list(names)}
        allow = {k: list(t) for k, t in self.allow_tools.items()}
        return {**data, "allow_tools": allow, "record": self.record, "replay": self.replay}


def _optional_path(value: object, path: str) -> str | None:
    if value is None or (isinstance(value, str) and value):
        return value
    raise ConfigError(f"{path}: got {value!r}; expected a file path or null")
