"""`model.attn_implementation` reaches the loaded model; a packed layout with a hybrid model is refused at start."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

from mcprl_policy import UnpackableModelError, build_tiny_model
from mcprl_policy.loading import load_tokenizer
from mcprl_train.build import build_policy
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError


def _attn(config: Config) -> str:
    model: Any = build_policy(config).model
    return model.config._attn_implementation


def test_auto_loads_varlen_sdpa_on_cpu_and_a_named_implementation_as_named() -> None:
    assert _attn(Config.load("cpu")) == "mcprl_varlen_sdpa"
    assert _attn(Config.load("cpu", overrides=["model.attn_implementation=eager"])) == "eager"


def test_an_unknown_attention_implementation_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="attn_implementation"):
        Config.load("cpu", overrides=["model.attn_implementation=flash"])


@pytest.fixture(scope="module")
def hybrid_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random 2-layer Qwen3.5 (one gated delta net layer, one full attention) with the tiny tokenizer."""
    out = tmp_path_factory.mktemp("qwen3_5")
    tokenizer = load_tokenizer(str(build_tiny_model("tiny", cache_dir=out / "cache")))
    config = Qwen3_5TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        layer_types=["linear_attention", "full_attention"],
        pad_token_id=tokenizer.pad_token_id,
    )
    model: Any = Qwen3_5ForCausalLM(config)
    model.save_pretrained(str(out / "model"))
    tokenizer.save_pretrained(str(out / "model"))
    return out / "model"


def test_a_hybrid_model_is_refused_for_the_packed_layout_and_loads_for_the_padded_one(
    hybrid_dir: Path,
) -> None:
    model = [f"model.name={hybrid_dir}", "model.value_head=false"]
    with pytest.raises(UnpackableModelError, match="linear_attention"):
        build_policy(Config.load("cpu", overrides=[*model, "optim.layout=packed"]))
    assert _attn(Config.load("cpu", overrides=[*model, "optim.layout=padded"])) == "mcprl_varlen_sdpa"
