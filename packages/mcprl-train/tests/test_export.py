"""`mcprl-train export`: real checkpoints of short demo runs (LoRA and full fine-tune) exported, reloaded with
the transformers Auto classes, and evaluated through the real evaluation path on the real offline MCP servers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
import structlog
import torch

from mcprl_train.cli import main
from mcprl_train.config import Config
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.checkpoint import Checkpoint
from mcprl_train.run.run_dir import RunDir

_SHORT_RUN = (
    "run.steps=1",
    "run.checkpoint_every=1",
    "run.seed=5",
    "tasks.train=preset:demo",
    "tasks.validation=preset:demo",
    "sft.enabled=true",
    "sft.steps=4",
    "sft.demos=16",
    "sft.batch_size=4",
    "grpo.group_size=2",
    "grpo.tasks_per_step=2",
    "grpo.filter_zero_std=false",
    "env.max_new_tokens_per_turn=24",
    "env.max_turns_by_difficulty={easy: 2, medium: 2, hard: 2}",
    "collection.max_concurrent_episodes=8",
    "eval.every=0",
    "eval.n_tasks=6",
    "optim.warmup_steps=0",
    "tracking.progress=false",
)


@pytest.fixture(autouse=True)
def _reset_structlog() -> Iterator[None]:
    yield
    structlog.reset_defaults()


def _train(root: Path, name: str, *extra: str) -> Checkpoint:
    config = Config.load("cpu", overrides=[f"run.name={name}", f"run.output_dir={root}", *_SHORT_RUN, *extra])
    run_dir = RunDir.create(config)
    Trainer(config, run_dir).run()
    checkpoint = run_dir.checkpoints.load_latest()
    assert checkpoint is not None
    return checkpoint


@pytest.fixture(scope="module")
def lora_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return _train(tmp_path_factory.mktemp("runs"), "lora", "lora={r: 4, alpha: 8}", "sft.lr=5e-3")


@pytest.fixture(scope="module")
def full_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return _train(tmp_path_factory.mktemp("runs"), "full")


def _greedy_evaluation(checkpoint: Checkpoint, policy: Any) -> list[list[int]]:
    """The token ids of each validation episode, as `mcprl-train eval` runs it (greedy, real servers)."""
    from mcprl_env import Environment
    from mcprl_tools import ToolManager
    from mcprl_train import build
    from mcprl_train.loop.evaluation import evaluate_tasks

    config = RunDir.open(checkpoint.path.parent.parent).load_config()
    assert config.tasks.validation is not None
    tasks = build.first_tasks(
        build.load_task_source(config.tasks.validation, name="validation"), config.eval.n_tasks
    )
    sampler = build.build_sampler(config, policy, greedy=True, seed=config.run.seed)

    async def run() -> list[list[int]]:
        async with ToolManager(build.servers_config(config)) as manager:
            env = Environment(manager=manager, tokenizer=policy.tokenizer, config=config.env)
            _, groups = await evaluate_tasks(
                env, tasks, sampler, max_concurrent_episodes=config.collection.max_concurrent_episodes
            )
        episodes = [e for g in groups for e in g.episodes]
        assert all(e.valid for e in episodes), [e.error for e in episodes]
        return [e.token_ids for e in episodes]

    return anyio.run(run)


def _checkpoint_policy(checkpoint: Checkpoint) -> Any:
    from mcprl_train import build

    config = RunDir.open(checkpoint.path.parent.parent).load_config()
    return build.build_policy(config, source=str(checkpoint.subdir("policy"))).eval()


def _exported_policy(directory: Path) -> Any:
    """The export as any transformers user loads it, wrapped for mcprl's sampler (no value head)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from mcprl_policy import Policy

    model: Any = AutoModelForCausalLM.from_pretrained(directory)  # pyright: ignore[reportUnknownMemberType]
    tokenizer: Any = AutoTokenizer.from_pretrained(directory)  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
    return Policy(model=model, tokenizer=tokenizer, value_head=None, base_model=str(directory)).eval()


def _assert_standard_hf_directory(directory: Path) -> dict[str, Any]:
    config = json.loads((directory / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert "auto_map" not in config  # no custom code: a stock transformers / vLLM architecture
    assert (directory / "model.safetensors").is_file()
    generation = json.loads((directory / "generation_config.json").read_text())
    assert generation.get("do_sample", False) is False  # the run's evaluation decoding: greedy
    assert generation["max_new_tokens"] == 24
    for leftover in ("mcprl_policy.json", "value_head.safetensors", "adapter_config.json"):
        assert not (directory / leftover).exists(), leftover
    return config


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_an_exported_lora_checkpoint_loads_with_auto_classes_and_reproduces_the_greedy_evaluation(
    lora_checkpoint: Checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "agent"
    assert main(["export", str(lora_checkpoint.path), str(out), "--adapter"]) == 0
    assert f"to {out}" in capsys.readouterr().out
    _assert_standard_hf_directory(out)
    card = (out / "README.md").read_text()
    assert f"vllm serve {out} --enable-auto-tool-choice --tool-call-parser hermes" in card
    assert "<tool_call>" in card
    assert "preset:demo" in card
    assert "base_model" not in card.split("---")[1]  # a local base (the embedded model) is no hub id
    assert (out / "mcprl_train_config.yaml").read_text() == (
        lora_checkpoint.path.parent.parent / "config.yaml"
    ).read_text()

    exported = _exported_policy(out)
    assert exported.tokenizer.chat_template == _checkpoint_policy(lora_checkpoint).tokenizer.chat_template
    reference = _checkpoint_policy(lora_checkpoint)
    base = reference.model.get_base_model()
    # The adapter learned something, so the merge is not a copy of the base.
    assert not torch.equal(
        exported.model.model.layers[0].self_attn.q_proj.weight,
        base.model.layers[0].self_attn.q_proj.base_layer.weight,
    )
    expected = _greedy_evaluation(lora_checkpoint, reference)
    assert len(expected) == 6
    assert _greedy_evaluation(lora_checkpoint, exported) == expected

    # The adapter alone loads onto the base with peft.
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base_dir = json.loads((lora_checkpoint.subdir("policy") / "mcprl_policy.json").read_text())["base_model"]
    base_model: Any = AutoModelForCausalLM.from_pretrained(base_dir)  # pyright: ignore[reportUnknownMemberType]
    adapted: Any = PeftModel.from_pretrained(base_model, out / "adapter")  # pyright: ignore[reportUnknownMemberType]
    assert adapted.peft_config["default"].r == 4


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_an_exported_full_fine_tune_reproduces_the_greedy_evaluation(
    full_checkpoint: Checkpoint, tmp_path: Path
) -> None:
    out = tmp_path / "agent"
    run = full_checkpoint.path.parent.parent
    assert main(["export", str(run), str(out), "--dtype", "bfloat16"]) == 0  # a run: its latest checkpoint
    config = _assert_standard_hf_directory(out)
    assert config["dtype"] == "bfloat16"
    out32 = tmp_path / "agent32"
    assert main(["export", str(run), str(out32)]) == 0
    expected = _greedy_evaluation(full_checkpoint, _checkpoint_policy(full_checkpoint))
    assert _greedy_evaluation(full_checkpoint, _exported_policy(out32)) == expected
    card = (out32 / "README.md").read_text()
    assert "full fine-tune" in card
    assert "lora" not in card.split("---")[1]


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_a_missing_checkpoint_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["export", str(tmp_path / "nope"), str(tmp_path / "out")]) == 2
    assert "nope: no such checkpoint or run directory" in _error(capsys)
    assert main(["export", str(tmp_path), str(tmp_path / "out")]) == 2
    assert "neither a checkpoint (no manifest.json) nor a run directory" in _error(capsys)
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_a_corrupt_checkpoint_is_refused_naming_the_file(
    full_checkpoint: Checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(full_checkpoint.path.parent.parent, run)
    weights = run / "checkpoints" / full_checkpoint.path.name / "policy" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert main(["export", str(weights.parent.parent), str(tmp_path / "out")]) == 2
    assert "checksum mismatch in policy/model.safetensors" in _error(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # nothing written, not even a temporary directory


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_an_occupied_output_is_refused_unless_forced(
    full_checkpoint: Checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["export", str(full_checkpoint.path), str(out)]) == 2
    assert f"{out}: exists and is not empty (--force replaces it)" in _error(capsys)
    assert (out / "keep.txt").read_text() == "mine"
    assert main(["export", str(full_checkpoint.path), str(out), "--force"]) == 0
    assert not (out / "keep.txt").exists()
    assert (out / "model.safetensors").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_an_output_inside_the_checkpoint_and_adapter_of_a_full_fine_tune_are_refused(
    full_checkpoint: Checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    inside = full_checkpoint.path / "export"
    assert main(["export", str(full_checkpoint.path), str(inside), "--force"]) == 2
    assert "overlaps the checkpoint" in _error(capsys)
    assert not inside.exists()
    assert main(["export", str(full_checkpoint.path), str(tmp_path / "o"), "--adapter"]) == 2
    assert "holds full weights, not a LoRA adapter" in _error(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_push_to_hub_with_the_hub_offline_fails_before_writing_anything(
    full_checkpoint: Checkpoint,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # read once, at its import
    out = tmp_path / "out"
    assert main(["export", str(full_checkpoint.path), str(out), "--push-to-hub", "me/agent"]) == 2
    assert "HF_HUB_OFFLINE is set" in _error(capsys)
    assert main(["export", str(full_checkpoint.path), str(out), "--push-to-hub", "not a repo"]) == 2
    assert "expected a repository id 'owner/name'" in _error(capsys)
    assert not out.exists()


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_push_to_hub_without_a_token_fails_before_writing_anything(
    full_checkpoint: Checkpoint,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_STORED_TOKENS_PATH", str(tmp_path / "no-tokens"))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    out = tmp_path / "out"
    assert main(["export", str(full_checkpoint.path), str(out), "--push-to-hub", "me/agent"]) == 2
    assert "no Hugging Face token; run `hf auth login` or set HF_TOKEN" in _error(capsys)
    assert not out.exists()


class _RefusingHub(BaseHTTPRequestHandler):
    """A stand-in for huggingface.co (unreachable here): records each request and refuses it with 401."""

    seen: ClassVar[list[tuple[str, str, str | None]]] = []

    def _refuse(self) -> None:
        type(self).seen.append((self.command, self.path, self.headers.get("authorization")))
        body = json.dumps({"error": "Invalid credentials in Authorization header"}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = _refuse

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.slow  # trains a short demo run once per module (~40 s)
def test_push_to_hub_goes_through_the_hub_api_and_a_refusal_keeps_the_complete_export(
    full_checkpoint: Checkpoint, tmp_path: Path
) -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RefusingHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    out = tmp_path / "out"
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "0",
        "HF_ENDPOINT": f"http://127.0.0.1:{server.server_address[1]}",
        "HF_TOKEN": "hf_test_token",
    }
    try:
        done = subprocess.run(
            [
                *(sys.executable, "-m", "mcprl_train", "export", str(full_checkpoint.path), str(out)),
                *("--push-to-hub", "me/agent", "--private"),
            ],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    finally:
        server.shutdown()
        thread.join()
    assert done.returncode == 2, done.stderr
    assert f"exported {out}, but the upload to me/agent failed" in done.stderr
    assert "hf upload me/agent" in done.stderr
    assert ("POST", "/api/repos/create", "Bearer hf_test_token") in _RefusingHub.seen
    assert (out / "model.safetensors").is_file()
    assert "vllm serve me/agent" in (out / "README.md").read_text()


_FAMILIES: dict[str, tuple[str, dict[str, object], str]] = {
    # real template file: (end-of-turn token, template kwargs, vLLM's --tool-call-parser)
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("<|im_end|>", {}, "hermes"),
    "Qwen-Qwen3-0.6B.jinja": ("<|im_end|>", {"enable_thinking": False}, "hermes"),
    "Qwen3.5-4B.jinja": ("<|im_end|>", {}, "qwen3_coder"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("<|im_end|>", {}, "hermes"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("<|eot_id|>", {}, "llama3_json"),
}


_ALIASES = {"hermes": "qwen3", "qwen3_coder": "qwen3.5", "llama3_json": "llama3.1"}


@pytest.mark.parametrize("template", sorted(_FAMILIES))
def test_the_model_card_names_vllms_tool_parser_for_each_real_template(
    template: str, chat_templates_dir: Path, template_tokenizer: Any
) -> None:
    from mcprl_env.parsing import PROBE_CALL
    from mcprl_train.commands.model_card import tool_call_format, vllm_tool_parser

    eos, kwargs, parser = _FAMILIES[template]
    text = (chat_templates_dir / template).read_text()
    tokenizer = template_tokenizer(text, eos, "mcprl_probe Paris city days tool_call function parameter")
    config = Config.load("cpu", overrides=[f"env.chat_template_kwargs={json.dumps(kwargs)}"])
    family, example = tool_call_format(tokenizer, config)
    assert vllm_tool_parser(family) == parser
    assert PROBE_CALL.name in example
    explicit = config.replace([f"env.parser={_ALIASES[family]}"])
    assert tool_call_format(tokenizer, explicit)[0] == family  # an alias names the same family


def test_every_mcprl_parser_family_has_a_vllm_tool_parser() -> None:
    from mcprl_env.parsing.registry import canonical_families
    from mcprl_train.commands.model_card import vllm_tool_parser

    assert {name: vllm_tool_parser(name) for name, _ in canonical_families()} == {
        "hermes": "hermes",
        "qwen3_coder": "qwen3_coder",
        "llama3_json": "llama3_json",
    }
