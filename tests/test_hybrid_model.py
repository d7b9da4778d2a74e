"""End to end on a Qwen3.5-style hybrid: `mcprl-train` (warm start → GRPO → checkpoint → eval) on a stand-in.

The stand-in (`standin_model("qwen3.5", ...)` in conftest.py) is a random-weight ``Qwen3_5ForCausalLM``: four
layers alternating gated-delta-net linear attention and full attention, with Qwen3.5's own 248k vocabulary
(`tests/test_qwen35_vocab.py` checks it; 248,320 embedding rows)
and Qwen3.5's chat template as published. The sampler batches its conv and recurrent states
(`mcprl_policy.cache_rows`); the learner runs the padded layout, because packing hybrids needs the
linear-attention kernels to restart their state at every sequence boundary. The demo's MCP servers are real
stdio subprocesses and the CLI is the real one; the short run is `e2e_testkit.SHORT`, started by a
`RunPool`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_testkit import (
    LORA,
    RunPool,
    StandinModel,
    check_short_run,
    read_jsonl,
    selected_params,
    train_and_evaluate,
)

pytestmark = pytest.mark.slow

PADDED = ["--set", "optim.layout=padded"]


@pytest.fixture(scope="module")
def hybrid_standin(standin_model: StandinModel) -> Path:
    return standin_model("qwen3.5-248k", "Qwen3.5-4B.jinja")


@pytest.fixture(scope="module")
def runs(
    request: pytest.FixtureRequest, hybrid_standin: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunPool]:
    pool = RunPool()
    for variant in selected_params(request, "variant"):
        extra = [*PADDED, *(LORA if variant == "lora" else ())]
        out = tmp_path_factory.mktemp(f"hybrid-{variant}")
        pool.submit(
            variant,
            lambda launch, out=out, extra=extra: train_and_evaluate(hybrid_standin, out, extra, launch),
        )
    yield pool
    pool.close()


@pytest.mark.parametrize("variant", ["full", "lora"])
def test_qwen35_hybrid_standin_trains_checkpoints_and_evaluates(
    hybrid_standin: Path, runs: RunPool, variant: str
) -> None:
    config = json.loads((hybrid_standin / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForCausalLM"]
    assert set(config["layer_types"]) == {"linear_attention", "full_attention"}
    assert config["vocab_size"] == 248_320
    result = runs.result(variant)
    check_short_run(result, vocab_limit=248_077)
    [grpo] = [r for r in read_jsonl(result.run / "metrics.jsonl") if r["kind"] == "grpo"]
    decode_calls = grpo["sampler/decode_calls"]
    assert isinstance(decode_calls, int | float), grpo
    assert decode_calls > 0, grpo
    policy = result.checkpoint / "policy"
    if variant == "lora":
        targets = set(json.loads((policy / "adapter_config.json").read_text())["target_modules"])
        assert {"in_proj_qkv", "in_proj_z", "out_proj", "q_proj", "o_proj"} <= targets
    else:
        assert not (policy / "adapter_config.json").exists()
