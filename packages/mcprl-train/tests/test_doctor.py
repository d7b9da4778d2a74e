from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path

import pytest
from rich.console import Console

from mcprl_train.commands.doctor import CheckResult, render_report, run_checks
from mcprl_train.config import Config

_SERVER = textwrap.dedent(
    """
    from mcp.server.mcpserver import MCPServer

    server = MCPServer("echo")

    @server.tool()
    def echo(text: str) -> str:
        return text

    @server.tool()
    def shout(text: str) -> str:
        return text.upper()

    if __name__ == "__main__":
        server.run()
    """
)

_TASK: dict[str, object] = {
    "id": "t1",
    "prompt": "Say hi",
    "servers": ["echo"],
    "difficulty": "easy",
    "answer": "hi",
    "checker": {"type": "exact"},
}


def _write_tasks(path: Path, tasks: list[Mapping[str, object]]) -> Path:
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def _config(tmp_path: Path, servers: Mapping[str, object], train: Path, validation: Path) -> Config:
    return Config.from_dict(
        {
            "tools": {"mcp_servers": servers},
            "tasks": {"train": str(train), "validation": str(validation)},
        }
    )


def _by_category(results: list[CheckResult], category: str) -> list[CheckResult]:
    return [r for r in results if r.category == category]


def test_a_good_config_passes_every_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "echo_server.py"
    script.write_text(_SERVER)
    monkeypatch.setenv("DOCTOR_TEST_TOKEN", "secret-value")
    servers = {
        "echo": {"command": sys.executable, "args": [str(script)], "env": {"TOKEN": "${DOCTOR_TEST_TOKEN}"}}
    }
    train = _write_tasks(tmp_path / "train.jsonl", [_TASK, {**_TASK, "id": "t2"}])
    results = run_checks(_config(tmp_path, servers, train, train))
    assert [r for r in results if not r.ok] == []
    [server] = _by_category(results, "servers")
    assert server.detail == "2 tools: echo, shout"
    [key] = _by_category(results, "keys")
    assert key.name == "${DOCTOR_TEST_TOKEN} (server echo)"
    assert [r.detail for r in _by_category(results, "tasks")] == ["2 tasks", "2 tasks"]
    console = Console(record=True, width=200)
    console.print(render_report(results))
    report = console.export_text()
    assert "all checks passed" in report
    assert "secret-value" not in report


def test_a_broken_config_names_each_failure_with_a_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DOCTOR_MISSING_KEY", raising=False)
    servers: dict[str, object] = {
        "ghost": {"command": "mcprl-no-such-server-binary", "args": []},
        "keyed": {"command": sys.executable, "args": ["-c", "pass"], "env": {"K": "${DOCTOR_MISSING_KEY}"}},
    }
    train = _write_tasks(tmp_path / "train.jsonl", [{**_TASK, "servers": ["echo"]}])
    broken = tmp_path / "validation.jsonl"
    broken.write_text(json.dumps(_TASK) + "\n" + json.dumps({"id": "bad", "difficulty": "easy"}) + "\n")
    config = _config(tmp_path, servers, train, broken).replace(["quantization=nf4", "lora.r=16"])
    results = run_checks(config, server_timeout=30)
    failed = {r.name: r for r in results if not r.ok}
    assert "check that 'mcprl-no-such-server-binary' is installed" in failed["ghost"].fix
    assert failed["${DOCTOR_MISSING_KEY} (server keyed)"].fix.startswith("export DOCTOR_MISSING_KEY=")
    assert failed["keyed"].detail.startswith("not started")
    assert "DOCTOR_MISSING_KEY" in failed["keyed"].detail
    assert "servers not configured: echo" in failed[f"tasks.train={train}"].detail
    validation = failed[f"tasks.validation={broken}"]
    assert ":2" in validation.detail
    assert validation.fix
    assert all(r.fix for r in failed.values())
    console = Console(record=True, width=200)
    console.print(render_report(results))
    assert f"{len(failed)} check(s) failed" in console.export_text()


@pytest.mark.parametrize(("disabled", "ok"), [("1", True), ("Yes", True), ("TRUE", True), ("", False)])
def test_weaves_key_row_reads_weave_disabled_as_tracking_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, disabled: str, ok: bool
) -> None:
    """Without WANDB_API_KEY, weave is fine only when WEAVE_DISABLED turns it off (1, true or yes)."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("WEAVE_DISABLED", disabled)
    script = tmp_path / "echo_server.py"
    script.write_text(_SERVER)
    train = _write_tasks(tmp_path / "train.jsonl", [_TASK])
    config = _config(tmp_path, {"echo": {"command": sys.executable, "args": [str(script)]}}, train, train)
    results = run_checks(config.replace(["tracking.weave=true"]))
    [row] = [r for r in _by_category(results, "keys") if r.name == "WANDB_API_KEY (tracking.weave)"]
    assert row.ok is ok
    assert bool(row.fix) is not ok


def test_a_cuda_profile_on_a_cpu_machine_fails_the_device_check(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    results = run_checks(Config.load(profile="a100x2"), servers=False)
    [device] = _by_category(results, "devices")
    assert not device.ok
    assert "needs 2 CUDA device(s)" in device.fix
    assert "torch threads, load" in device.detail


def _tokenizer_only_model(tmp_path: Path, template: str) -> Path:
    """The embedded tiny model's tokenizer and config.json (no weights: doctor reads none) with ``template``."""
    import shutil

    from mcprl_policy.loading import resolve_model_path

    directory = Path(
        shutil.copytree(
            resolve_model_path("tiny"), tmp_path / "model", ignore=shutil.ignore_patterns("*.safetensors")
        )
    )
    (directory / "chat_template.jinja").write_text(template)
    return directory


def test_the_model_rows_recognise_a_real_templates_format(tmp_path: Path, chat_templates_dir: Path) -> None:
    model = _tokenizer_only_model(tmp_path, (chat_templates_dir / "Qwen3.5-4B.jinja").read_text())
    results = _by_category(
        run_checks(Config.from_dict({"model": {"name": str(model)}}), servers=False), "model"
    )
    assert [(r.name, r.ok) for r in results] == [
        ("tokenizer", True),
        ("template", True),
        ("parser", True),
        ("vocabulary", True),
    ]
    assert results[2].detail == "env.parser=auto: recognised 'qwen3_coder'"


def test_the_model_rows_name_a_vocabulary_mismatch_and_a_wrong_parser_with_their_fix(
    tmp_path: Path, chat_templates_dir: Path
) -> None:
    model = _tokenizer_only_model(tmp_path, (chat_templates_dir / "Qwen-Qwen3-0.6B.jinja").read_text())
    config_file = model / "config.json"
    model_config = json.loads(config_file.read_text())
    model_config["vocab_size"] -= 1
    config_file.write_text(json.dumps(model_config))
    config = Config.from_dict({"model": {"name": str(model)}, "env": {"parser": "llama3_json"}})
    failed = {r.name: r for r in _by_category(run_checks(config, servers=False), "model") if not r.ok}
    assert sorted(failed) == ["parser", "vocabulary"]
    assert "env.parser=llama3_json does not read the tool call" in failed["parser"].detail
    assert "env.parser=auto" in failed["parser"].fix
    rows = model_config["vocab_size"]
    assert f"the tokenizer has {rows + 1} token ids but the model's embedding has {rows} rows" in (
        failed["vocabulary"].detail
    )
    assert "resize_token_embeddings" in failed["vocabulary"].fix
