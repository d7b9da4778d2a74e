"""A model the pipeline cannot use stops `mcprl-train` at start, in one `error:` line, before any run directory.

The models are the Qwen3 stand-in (`standin_model` in conftest.py: the real tokenizer and config.json) with
what a user might bring instead: a published template in a tool-call format nobody parses (GLM-4.6), a
published template that never shows the tools to the model (DeepSeek-V3.1's: the tools go into the system
prompt by hand), a parser that is not the template's, and a config.json whose embedding is smaller than the
tokenizer. The weights are left out of these copies: the checks read the tokenizer, template and config only.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from e2e_testkit import StandinModel

from mcprl_train.cli import main


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    """`train` and `doctor` configure structlog for the test's captured output: later tests get it back."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def weightless_qwen3(standin_model: StandinModel, tmp_path: Path) -> Path:
    """A copy of the Qwen3 stand-in without its weights."""
    source = standin_model("qwen3", "Qwen-Qwen3-0.6B.jinja")
    return Path(shutil.copytree(source, tmp_path / "model", ignore=shutil.ignore_patterns("*.safetensors")))


def _train(model: Path, out: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    code = main(["train", "--set", f"model.name={model}", "--set", f"run.output_dir={out}", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert not out.exists() or not any(out.iterdir()), f"a run directory was written: {list(out.iterdir())}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


def test_a_tool_call_format_nobody_parses_names_env_parser(
    weightless_qwen3: Path, chat_templates_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(chat_templates_dir / "GLM-4.6.jinja", weightless_qwen3 / "chat_template.jinja")
    line = _train(weightless_qwen3, tmp_path / "out", capsys)
    assert "no registered parser reads the tool calls" in line
    assert "<arg_key>city</arg_key>" in line  # what the template rendered
    assert "set env.parser to one of ['hermes', 'qwen3_coder', 'llama3_json']" in line


def test_a_template_without_tool_support_is_refused(
    weightless_qwen3: Path, chat_templates_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shutil.copy(
        chat_templates_dir / "deepseek-ai-DeepSeek-V3.1.jinja", weightless_qwen3 / "chat_template.jinja"
    )
    line = _train(weightless_qwen3, tmp_path / "out", capsys)
    assert "the chat template has no tool support" in line


def test_a_tokenizer_without_a_chat_template_is_refused(
    weightless_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (weightless_qwen3 / "chat_template.jinja").unlink()
    line = _train(weightless_qwen3, tmp_path / "out", capsys)
    assert "has no chat template" in line
    assert "chat_template.jinja" in line


def test_a_parser_that_is_not_the_templates_is_refused(
    weightless_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    line = _train(weightless_qwen3, tmp_path / "out", capsys, "--set", "env.parser=qwen3_coder")
    assert "env.parser=qwen3_coder does not read the tool call this template renders" in line
    assert "<tool_call>" in line


def test_an_embedding_smaller_than_the_tokenizer_is_refused(
    weightless_qwen3: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = json.loads((weightless_qwen3 / "config.json").read_text())
    config["vocab_size"] = 151_646  # Qwen3's tokenizer has 151,669 ids
    (weightless_qwen3 / "config.json").write_text(json.dumps(config))
    line = _train(weightless_qwen3, tmp_path / "out", capsys)
    assert "the tokenizer has 151669 token ids but the model's embedding has 151646 rows" in line


def test_doctor_passes_the_real_template_and_fails_a_broken_one_with_its_fix(
    weightless_qwen3: Path, chat_templates_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["doctor", "--skip-servers", "--set", f"model.name={weightless_qwen3}"]
    assert main(args) == 0, capsys.readouterr().out
    report = capsys.readouterr().out
    assert "recognised 'hermes'" in report
    assert "151669 token ids <= 151936 embedding rows" in report
    shutil.copy(chat_templates_dir / "GLM-4.6.jinja", weightless_qwen3 / "chat_template.jinja")
    assert main(args) == 1
    report = capsys.readouterr().out
    assert "FAIL" in report
    assert "env.parser" in report
