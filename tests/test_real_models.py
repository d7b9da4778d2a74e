"""End to end on real model families: `mcprl-train` (warm start → GRPO → checkpoint → eval) on stand-ins.

Each stand-in (`standin_model` in conftest.py, `mcprl_policy.standin`) is a two-layer random-weight Qwen3 with
everything else a published checkpoint has: the 151,936-row embedding, the release's tokenizer (151,669 ids for
Qwen3, 151,665 for Qwen2.5) rebuilt from llama.cpp's Qwen2 vocabulary, and the vendor's chat template as
published. The runs use the demo's offline MCP servers (real stdio subprocesses) and the real CLI.

The Llama stand-ins (`llama_standin_model`) are two-layer random-weight ``LlamaForCausalLM``s with the 128,256-row
embedding and the Llama 3 tokenizer rebuilt from llama.cpp's ``ggml-vocab-llama-bpe.gguf`` (Meta's special-token
names, or Hermes 3's ChatML end of turn), under Llama 3.1's, Llama 3.2's and Hermes 3's templates.

Qwen3.5 has its own 248k vocabulary, which is not available here (llama.cpp's ``ggml-vocab-qwen35.gguf`` holds
the Qwen2 vocabulary under Qwen3.5's pre-tokenizer name); its template (XML tool calls, ``<think>`` generation
prompt) runs on the Qwen3 vocabulary, which holds every token the template writes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

StandinModel = Callable[[str, str], Path]
"""The `standin_model` fixture: ``(release, template file) -> model directory``."""

# A couple of warm-start steps, one GRPO step that updates (zero-variance groups kept: a random model's rewards
# are all equal), a checkpoint after it, a validation of two tasks before and after.
SHORT = [
    "--set", "run.seed=0",
    "--set", "sft.steps=2",
    "--set", "sft.batch_size=1",
    "--set", "sft.demos=4",
    "--set", "sft.warmup_steps=0",
    "--set", "run.steps=1",
    "--set", "run.checkpoint_every=1",
    "--set", "grpo.tasks_per_step=2",
    "--set", "grpo.group_size=2",
    "--set", "grpo.filter_zero_std=false",
    "--set", "eval.every=0",
    "--set", "eval.n_tasks=2",
    "--set", "env.max_new_tokens_per_turn=16",
    "--set", "env.max_total_tokens=2048",
    "--set", "optim.lr=1e-4",
    "--set", "optim.logits_chunk_size=256",
    "--set", "tracking.wandb=disabled",
    "--set", "tracking.progress=false",
]  # fmt: skip

LORA = ["--set", "lora={r: 4, alpha: 8}"]

# The model is random, so the run proves the wiring, not learning: every episode is valid (no template drift, no
# infrastructure fault), every stage ran, and the checkpoint loads and evaluates.


def _cli(*args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "WEAVE_DISABLED": "true", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mcprl_train", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def _train_and_evaluate(
    model: Path, out: Path, *extra: str, vocab_limit: int = 151_669
) -> tuple[Path, dict[str, object]]:
    proc = _cli(
        "train",
        "--set",
        f"model.name={model}",
        "--set",
        f"run.output_dir={out}",
        "--run-name",
        "run",
        *SHORT,
        *extra,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = out / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["sft_step"] for r in records if r["kind"] == "sft"] == [1, 2]
    grpo = [r for r in records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo] == [1]
    assert grpo[0]["rollout/valid_frac"] == 1.0, grpo[0]
    episodes = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    assert all(e["valid"] and e["error"] is None for e in episodes), [e["error"] for e in episodes]
    assert all(max(e["token_ids"]) < vocab_limit for e in episodes)
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().split()[0]
    evaluated = _cli("eval", "--checkpoint", str(checkpoint))
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    summary = json.loads(evaluated.stdout[evaluated.stdout.index("{") :])
    assert summary["step"] == 1
    assert summary["checkpoint"] == str(checkpoint)
    assert summary["tasks"] == 2
    assert summary["val/valid_frac"] == 1.0, summary
    return checkpoint, summary


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_qwen3_standin_trains_checkpoints_and_evaluates(
    standin_model: StandinModel, tmp_path: Path, lora: bool
) -> None:
    model = standin_model("qwen3", "Qwen-Qwen3-0.6B.jinja")
    checkpoint, _ = _train_and_evaluate(model, tmp_path, *(LORA if lora else ()))
    policy = checkpoint / "policy"
    assert (policy / "adapter_config.json").is_file() == lora
    assert (policy / "chat_template.jinja").read_text() == (model / "chat_template.jinja").read_text()


@pytest.mark.parametrize(
    ("release", "template"),
    [("qwen3", "Qwen3.5-4B.jinja"), ("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja")],
    ids=["qwen3.5-template", "qwen2.5"],
)
def test_other_qwen_templates_train_checkpoint_and_evaluate(
    standin_model: StandinModel, tmp_path: Path, release: str, template: str
) -> None:
    _train_and_evaluate(standin_model(release, template), tmp_path)


@pytest.mark.parametrize(
    ("release", "template", "lora"),
    [
        ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", False),
        ("llama3.1", "meta-llama-Llama-3.1-8B-Instruct.jinja", True),
        ("llama3.1", "meta-llama-Llama-3.2-3B-Instruct.jinja", False),
        ("hermes3", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", False),
    ],
    ids=["llama3.1-full", "llama3.1-lora", "llama3.2", "hermes3"],
)
def test_llama_family_standins_train_checkpoint_and_evaluate(
    llama_standin_model: StandinModel, tmp_path: Path, release: str, template: str, lora: bool
) -> None:
    model = llama_standin_model(release, template)
    checkpoint, _ = _train_and_evaluate(model, tmp_path, *(LORA if lora else ()), vocab_limit=128_256)
    policy = checkpoint / "policy"
    assert (policy / "adapter_config.json").is_file() == lora
    assert (policy / "chat_template.jinja").read_text() == (model / "chat_template.jinja").read_text()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert all(r["sft/tokens"] > 0 for r in records if r["kind"] == "sft"), records


def test_qwen3_with_thinking_on_warm_starts_on_reasoning_demonstrations(
    standin_model: StandinModel, tmp_path: Path
) -> None:
    """``enable_thinking: true``: the scripted demonstrations carry reasoning (`mcprl_tasks.with_reasoning`),
    the template renders it as each turn's think block, and the run stays valid end to end."""
    model = standin_model("qwen3", "Qwen-Qwen3-0.6B.jinja")
    _train_and_evaluate(model, tmp_path, "--set", "env.chat_template_kwargs={enable_thinking: true}")
    config = (tmp_path / "run" / "config.yaml").read_text()
    assert "enable_thinking: true" in config
