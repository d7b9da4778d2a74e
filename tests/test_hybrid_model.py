"""End to end on a Qwen3.5-style hybrid: `mcprl-train` (warm start → GRPO → checkpoint → eval) on a stand-in.

The stand-in (`mcprl_policy.standin.save_standin_model(architecture="qwen3.5")`) is a random-weight
``Qwen3_5ForCausalLM``: four layers alternating gated-delta-net linear attention and full attention, the
151,936-row Qwen2/Qwen3 vocabulary (Qwen3.5's own 248k vocabulary is not available offline; the Qwen3 one holds
every token its template writes) and Qwen3.5's chat template as published. The sampler batches its conv and
recurrent states (`mcprl_policy.cache_rows`); the learner runs the padded layout, because packing hybrids
needs the linear-attention kernels to restart their state at every sequence boundary. The demo's MCP servers
are real stdio subprocesses and the CLI is the real one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

# Two warm-start steps, one GRPO step that updates (zero-variance groups kept: a random model's rewards are all
# equal), a checkpoint after it, a validation of two tasks before and after.
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
    "--set", "optim.layout=padded",
    "--set", "tracking.wandb=disabled",
    "--set", "tracking.progress=false",
]  # fmt: skip


@pytest.fixture(scope="module")
def hybrid_standin(chat_templates_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gguf", reason="the Qwen vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import qwen_tokenizer, save_standin_model

    tokenizer = qwen_tokenizer(
        chat_templates_dir / "ggml-vocab-qwen2.gguf",
        release="qwen3",
        chat_template=(chat_templates_dir / "Qwen3.5-4B.jinja").read_text(),
    )
    return save_standin_model(tmp_path_factory.mktemp("standin-qwen3.5"), tokenizer, architecture="qwen3.5")


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "WEAVE_DISABLED": "true", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "mcprl_train", *args],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        check=False,
    )


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_qwen35_hybrid_standin_trains_checkpoints_and_evaluates(
    hybrid_standin: Path, tmp_path: Path, lora: bool
) -> None:
    config = json.loads((hybrid_standin / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert set(config["layer_types"]) == {"linear_attention", "full_attention"}
    lora_args = ["--set", "lora={r: 4, alpha: 8}"] if lora else []
    proc = _cli(
        "train",
        "--set",
        f"model.name={hybrid_standin}",
        "--set",
        f"run.output_dir={tmp_path}",
        "--run-name",
        "run",
        *SHORT,
        *lora_args,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    run = tmp_path / "run"
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["sft_step"] for r in records if r["kind"] == "sft"] == [1, 2]
    grpo = [r for r in records if r["kind"] == "grpo"]
    assert [r["step"] for r in grpo] == [1]
    assert grpo[0]["rollout/valid_frac"] == 1.0, grpo[0]
    assert grpo[0]["sampler/decode_calls"] > 0
    episodes = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    assert all(e["valid"] and e["error"] is None for e in episodes), [e["error"] for e in episodes]
    assert all(max(e["token_ids"]) < 151_669 for e in episodes)
    checkpoint = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().split()[0]
    policy = checkpoint / "policy"
    if lora:
        targets = set(json.loads((policy / "adapter_config.json").read_text())["target_modules"])
        assert {"in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "o_proj"} <= targets
    else:
        assert not (policy / "adapter_config.json").exists()
    evaluated = _cli("eval", "--checkpoint", str(checkpoint))
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    summary = json.loads(evaluated.stdout[evaluated.stdout.index("{") :])
    assert summary["step"] == 1
    assert summary["tasks"] == 2
    assert summary["val/valid_frac"] == 1.0, summary
