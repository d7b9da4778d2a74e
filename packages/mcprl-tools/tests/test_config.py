"""Servers config: formats, `${VAR}` secrets, and errors that name file, server, key and expectation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mcprl_tools import ConfigError, MissingVariableError, ServersConfig


def test_loads_the_mcp_servers_json_format_with_our_keys(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "fs": {
                        "command": "npx",
                        "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"],
                    },
                    "web": {"url": "http://127.0.0.1:9/mcp", "headers": {"X-Team": "rl"}, "call_timeout": 5},
                    "off": {"command": "nothing", "disabled": True},
                },
                "defaults": {"max_concurrency": 4},
                "aliases": {"python_code": "code"},
            }
        )
    )
    cfg = ServersConfig.load(path)
    assert list(cfg.servers) == ["fs", "web"]
    fs, web = cfg.servers["fs"], cfg.servers["web"]
    assert fs.transport == "stdio"
    assert fs.args == ("-y", "@modelcontextprotocol/server-filesystem", "/tmp")
    assert fs.max_concurrency == 4
    assert web.transport == "http"
    assert web.call_timeout == 5.0
    assert cfg.aliases_for("fs") == {"python_code": "code"}
    assert cfg.source == str(path)


def test_yaml_and_toml_are_accepted(tmp_path: Path) -> None:
    (tmp_path / "s.yaml").write_text(
        "mcpServers:\n  a:\n    command: python\n    restart: {max_crashes: 2}\n"
    )
    (tmp_path / "s.toml").write_text('[mcpServers.a]\ncommand = "python"\noutput_cap_bytes = 1024\n')
    assert ServersConfig.load(tmp_path / "s.yaml").servers["a"].restart.max_crashes == 2
    assert ServersConfig.load(tmp_path / "s.toml").servers["a"].output_cap_bytes == 1024


def test_unknown_key_names_file_server_key_and_nearest_valid_key(tmp_path: Path) -> None:
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"mcpServers": {"finance": {"comand": "python"}}}))
    with pytest.raises(ConfigError) as err:
        ServersConfig.load(path)
    message = str(err.value)
    assert str(path) in message
    assert 'server "finance"' in message
    assert 'unknown key "comand"' in message
    assert 'did you mean "command"?' in message


def test_wrong_type_names_the_key_and_what_was_expected() -> None:
    with pytest.raises(
        ConfigError, match=r'<x>: server "a", key "call_timeout": expected a number, got \'soon\''
    ):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "call_timeout": "soon"}}}, source="<x>")
    with pytest.raises(
        ConfigError, match=r'server "a", key "restart", key "max_crashs"|did you mean "max_crashes"'
    ):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "restart": {"max_crashs": 1}}}})
    with pytest.raises(ConfigError, match=r'key "on_catalogue_change": expected "warn" or "refuse"'):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "on_catalogue_change": "ignore"}}})
    with pytest.raises(ConfigError, match=r'expected a "command" \(stdio server\) or a "url"'):
        ServersConfig.from_dict({"mcpServers": {"a": {"args": []}}})
    with pytest.raises(ConfigError, match='top level: unknown key "mcpServer"; did you mean "mcpServers"'):
        ServersConfig.from_dict({"mcpServer": {}})


def test_missing_variable_names_the_server_and_the_variable() -> None:
    with pytest.raises(MissingVariableError) as err:
        ServersConfig.from_dict(
            {"mcpServers": {"finance": {"command": "p", "env": {"KEY": "${FINANCE_API_KEY}"}}}},
            source="servers.json",
            environ={},
        )
    assert 'server "finance"' in str(err.value)
    assert "${FINANCE_API_KEY}" in str(err.value)


def test_each_server_lists_the_variables_it_references() -> None:
    data = {
        "mcpServers": {
            "a": {"command": "p", "env": {"K": "${SET_KEY}"}, "args": ["--token=${UNSET_KEY}"]},
            "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${SET_KEY}"}},
            "c": {"command": "p"},
        }
    }
    with pytest.raises(MissingVariableError, match=r"\$\{UNSET_KEY\}"):
        ServersConfig.from_dict(data, environ={"SET_KEY": "v"})
    cfg = ServersConfig.from_dict(data, environ={"SET_KEY": "v"}, missing_variables="keep")
    a, b, c = cfg.servers["a"], cfg.servers["b"], cfg.servers["c"]
    assert a.variables == {"SET_KEY", "UNSET_KEY"}
    assert b.variables == {"SET_KEY"}
    assert c.variables == frozenset()
    assert a.env == {"K": "v"}
    assert a.args == ("--token=${UNSET_KEY}",)
    assert a.secrets == {"v"}


def test_secrets_reach_only_their_server_and_are_redacted() -> None:
    environ = {"TOKEN": "s3cr3t-canary", "OTHER": "unused"}
    cfg = ServersConfig.from_dict(
        {
            "mcpServers": {
                "a": {"command": "p", "env": {"API_KEY": "${TOKEN}"}, "args": ["--key=${TOKEN}"]},
                "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${TOKEN}"}},
                "c": {"command": "p"},
            }
        },
        environ=environ,
    )
    a, b, c = cfg.servers["a"], cfg.servers["b"], cfg.servers["c"]
    assert a.env == {"API_KEY": "s3cr3t-canary"}
    assert a.args == ("--key=s3cr3t-canary",)
    assert b.headers == {"Authorization": "Bearer s3cr3t-canary"}
    assert dict(c.env) == {}
    for text in (repr(cfg), repr(a), repr(b)):
        assert "s3cr3t-canary" not in text
    assert a.redact("failed with --key=s3cr3t-canary") == "failed with --key=***"
    assert c.redact("s3cr3t-canary") == "s3cr3t-canary"


def test_stdio_and_http_keys_do_not_mix() -> None:
    with pytest.raises(ConfigError, match='key "headers": not valid for a stdio server'):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "headers": {}}}})
    with pytest.raises(ConfigError, match='key "type": expected one of'):
        ServersConfig.from_dict({"mcpServers": {"a": {"type": "sse", "url": "http://h"}}})


def test_unreadable_or_malformed_files_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read servers config"):
        ServersConfig.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=f"{bad}: not valid json"):
        ServersConfig.load(bad)


def test_redact_json_replaces_secrets_inside_nested_strings() -> None:
    cfg = ServersConfig.from_dict(
        {"mcpServers": {"a": {"command": "p", "env": {"K": "${T}"}}}}, environ={"T": 'to"ken'}
    ).servers["a"]
    value = {"rows": [{"k": 'x to"ken y'}], "n": 1}
    assert cfg.redact_json(value) == {"rows": [{"k": "x *** y"}], "n": 1}
    assert cfg.redact_json({"clean": True}) == {"clean": True}
    assert cfg.redact_json(None) is None


def test_stateful_cooldown_and_argument_cap_are_read_and_checked() -> None:
    cfg = ServersConfig.from_dict(
        {
            "mcpServers": {
                "search": {"command": "p", "stateful": False, "restart": {"cooldown": 5}},
                "messaging": {"command": "p"},
            },
            "defaults": {"max_argument_bytes": 4096},
        }
    )
    search, messaging = cfg.servers["search"], cfg.servers["messaging"]
    assert (search.stateful, search.restart.cooldown, search.max_argument_bytes) == (False, 5.0, 4096)
    assert (messaging.stateful, messaging.restart.cooldown) == (True, 60.0)
    with pytest.raises(ConfigError, match=r'server "a", key "stateful": expected true or false, got \'no\''):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "stateful": "no"}}})
    with pytest.raises(ConfigError, match=r'key "max_argument_bytes": expected an integer >= 64, got 10'):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "max_argument_bytes": 10}}})
    with pytest.raises(ConfigError, match=r'key "cooldown": expected a positive value, got 0'):
        ServersConfig.from_dict({"mcpServers": {"a": {"command": "p", "restart": {"cooldown": 0}}}})
