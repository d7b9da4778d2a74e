from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from transformers import Qwen3Config

from mcprl_train.commands.plan import ModelShape, load_model_shape, plan_memory, render_plan
from mcprl_train.config import Config
from mcprl_train.errors import PlanError

GIB = 1024**3


def _qwen3_0_6b_dir(tmp_path: Path) -> Path:
    """A local config directory with Qwen/Qwen3-0.6B's published shape (no weights)."""
    path = tmp_path / "qwen3-0.6b"
    Qwen3Config(  # pyright: ignore[reportUnknownMemberType]  # save_pretrained: transformers leaves **kwargs unannotated
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=True,
    ).save_pretrained(path)
    return path


def _small_dir(tmp_path: Path) -> Path:
    path = tmp_path / "small"
    Qwen3Config(  # pyright: ignore[reportUnknownMemberType]  # save_pretrained: transformers leaves **kwargs unannotated
        vocab_size=4096,
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        tie_word_embeddings=False,
    ).save_pretrained(path)
    return path


def test_parameter_count_matches_qwen3_0_6b(tmp_path: Path) -> None:
    shape = load_model_shape(str(_qwen3_0_6b_dir(tmp_path)))
    # per layer: q 1024·2048 + k,v 2·1024·1024 + o 2048·1024 + mlp 3·1024·3072 + norms 2·1024 + q/k norms 2·128
    layer = 2_097_152 + 2_097_152 + 2_097_152 + 9_437_184 + 2048 + 256
    assert shape.layer_params == layer == 15_730_944
    # embedding 151936·1024 (tied head) + 28 layers + final norm: the published 0.6 B / 0.44 B non-embedding
    assert shape.num_params == 155_582_464 + 28 * 15_730_944 + 1024 == 596_049_920


def test_a100x2_zero3_plan_matches_hand_computation(tmp_path: Path) -> None:
    shape = load_model_shape(str(_qwen3_0_6b_dir(tmp_path)))
    plan = plan_memory(Config.load(profile="a100x2"), shape)
    p = 596_049_920
    assert plan.num_devices == 2
    assert plan.trainable_params == p
    assert plan.rows == {
        "weights": p * 2 // 2,  # bf16, partitioned over 2 ranks
        "zero3 gathered params": 155_582_464 * 2,  # the (tied) embedding is the largest gathered module
        "gradients": p * 2 // 2,
        "optimizer states": (p * 8 + p * 4) // 2,  # fp32 m, v + fp32 master weights, partitioned
        "reference policy": p * 2 // 2,
        # checkpointed: 8192 tokens · (28 layer inputs · 1024 · 2 B + one layer: 2 B · (3·1024 + 2048 + 2·1024 + 2048 + 3·3072))
        "activations": 8192 * (28 * 1024 * 2 + 2 * 18_432),
        "logits chunk": 1024 * 151_936 * 4 * 3,
        "sampler kv cache": 64 * 4096 * 2 * 28 * 1024 * 2,
        "sampler prefix cache": GIB,  # sampler.prefix_cache_mb's default, 1024 MiB
        "cuda context": GIB // 2,
    }
    assert (
        plan.total
        == 3_576_299_520
        + 3 * 596_049_920
        + 311_164_928
        + 771_751_936
        + 1_866_989_568
        + 30_064_771_072
        + GIB
        + GIB // 2
    )
    assert plan.device_memory == 80 * GIB
    assert plan.fits


def test_qlora_plan_of_a_small_model_matches_hand_computation(tmp_path: Path) -> None:
    shape = load_model_shape(str(_small_dir(tmp_path)))
    config = Config.load(profile="single-gpu-lora", overrides=["model.gradient_checkpointing=false"])
    plan = plan_memory(config, shape)
    # per layer linear: q 256·256 + k,v 2·256·128 + o 256·256 + mlp 3·256·1024 = 983_040; 4 layers
    linear = 4 * 983_040
    total = 4096 * 256 * 2 + 4 * (983_040 + 512 + 128) + 256  # embedding + untied head + layers + final norm
    assert shape.num_params == total == 6_032_128
    # LoRA r=16 on all 7 projections: 16 · Σ(in + out) = 16 · (512 + 384 + 384 + 512 + 1280 + 1280 + 1280)
    lora = 4 * 16 * 5632
    assert plan.trainable_params == lora == 360_448
    assert plan.rows["weights"] == round(linear * (0.5 + 4 / 64)) + (total - linear) * 2
    assert plan.rows["lora adapters (fp32)"] == lora * 4
    assert plan.rows["gradients"] == lora * 4
    assert plan.rows["optimizer states"] == lora * 8
    assert "reference policy" not in plan.rows  # adapters disabled, no copy
    # no checkpointing: 8192 tokens · 4 layers · 2 B · (3·256 + 256 + 2·128 + 256 + 3·1024)
    assert plan.rows["activations"] == 8192 * 4 * 2 * 4608
    assert plan.rows["sampler kv cache"] == 16 * 4096 * 2 * 4 * 128 * 2
    off = plan_memory(
        Config.load(
            profile="single-gpu-lora",
            overrides=["model.gradient_checkpointing=false", "sampler.prefix_cache_mb=0"],
        ),
        shape,
    )
    assert "sampler prefix cache" not in off.rows
    assert plan.total - off.total == GIB


def test_gradient_checkpointing_and_zero_stages_shrink_the_estimate(tmp_path: Path) -> None:
    shape = load_model_shape(str(_qwen3_0_6b_dir(tmp_path)))
    base = Config.load(profile="a100x2")
    with_ckpt = plan_memory(base, shape).rows["activations"]
    without = plan_memory(base.replace(["model.gradient_checkpointing=false"]), shape).rows["activations"]
    assert with_ckpt < without
    by_stage = {
        stage: plan_memory(base.replace([f"distributed.zero_stage={stage}"]), shape).rows
        for stage in (0, 1, 2, 3)
    }
    assert by_stage[1]["optimizer states"] == by_stage[0]["optimizer states"] // 2
    assert by_stage[2]["gradients"] == by_stage[1]["gradients"] // 2
    assert by_stage[3]["weights"] == by_stage[2]["weights"] // 2


def test_vllm_share_is_reserved_from_the_device(tmp_path: Path) -> None:
    shape = load_model_shape(str(_small_dir(tmp_path)))
    plan = plan_memory(Config.load(profile="vllm-gpu"), shape)
    assert plan.reserved == int(24 * GIB * 0.35)
    assert "sampler kv cache" not in plan.rows
    assert plan.total == sum(plan.rows.values()) + plan.reserved


def test_a_plan_that_exceeds_the_device_says_it_does_not_fit(tmp_path: Path) -> None:
    shape = load_model_shape(str(_qwen3_0_6b_dir(tmp_path)))
    config = Config.load(profile="a100x2", overrides=["distributed.device_memory_gb=16"])
    plan = plan_memory(config, shape)
    assert plan.fits is False
    console = Console(record=True, width=120)
    console.print(render_plan(plan))
    assert "does not fit" in console.export_text()


def test_tiny_model_shape_comes_from_the_embedded_preset() -> None:
    shape = load_model_shape("tiny")
    assert (shape.hidden_size, shape.num_layers) == (128, 2)
    assert plan_memory(Config.load(), shape).device == "cpu"


def test_unreadable_model_config_is_a_plan_error(tmp_path: Path) -> None:
    with pytest.raises(PlanError, match="cannot read the model config"):
        load_model_shape(str(tmp_path / "missing"))


def test_unknown_lora_target_is_a_plan_error() -> None:
    shape = ModelShape(
        vocab_size=10,
        hidden_size=8,
        intermediate_size=16,
        num_layers=1,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
    )
    with pytest.raises(PlanError, match="not linear layers"):
        shape.lora_params(4, ("c_attn",))
