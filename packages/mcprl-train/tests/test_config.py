from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mcprl_train.config import (
    Config,
    InlineServers,
    OfflineServers,
    ServersFile,
    list_profiles,
    parse_override,
)
from mcprl_train.errors import ConfigError


def test_every_shipped_profile_loads_and_round_trips() -> None:
    assert set(list_profiles()) >= {"cpu", "cpu-smollm2", "single-gpu-lora", "vllm-gpu", "a100x2", "mps"}
    for name in list_profiles():
        cfg = Config.load(profile=name)
        assert cfg.profile == name
        assert Config.from_dict(cfg.to_dict()) == cfg
        assert Config.from_dict(yaml.safe_load(cfg.to_yaml())) == cfg


def test_defaults_follow_the_seed_hyperparameters() -> None:
    cfg = Config.load(profile=None)
    assert (cfg.grpo.clip_eps_low, cfg.grpo.kl_coef, cfg.grpo.value_coef) == (0.2, 0.01, 0.5)
    # γ = 1: an outcome reward at the last token is not discounted over long turns (the seeds' 0.99 is settable).
    assert (cfg.grpo.gamma, cfg.grpo.lam) == (1.0, 0.95)
    assert Config.load(profile=None, overrides=["grpo.gamma=0.99"]).grpo.gamma == 0.99
    assert cfg.optim.lr == 5e-6
    assert cfg.optim.warmup_steps > 0
    assert (cfg.reference.every, cfg.reference.ema, cfg.grpo.tis) == (0, 0.0, None)
    assert cfg.model.name == "tiny"


def test_profiles_select_their_hardware_setup() -> None:
    cpu = Config.load()
    assert (cpu.profile, cpu.model.name, cpu.model.dtype, cpu.sampler.backend) == (
        "cpu",
        "tiny-8h",
        "float32",
        "hf",
    )
    lora = Config.load(profile="single-gpu-lora")
    assert lora.quantization == "nf4"
    assert lora.lora is not None
    a100 = Config.load(profile="a100x2")
    assert (a100.distributed.backend, a100.distributed.zero_stage, a100.distributed.num_gpus) == (
        "deepspeed",
        3,
        2,
    )
    assert a100.distributed.bf16
    assert a100.lora is None
    assert Config.load(profile="vllm-gpu").sampler.backend == "vllm"
    assert Config.load(profile="mps").model.device == "mps"


def test_user_file_and_overrides_win_in_order(tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text("grpo:\n  group_size: 6\n  kl_coef: 0.05\nrun:\n  name: mine\n")
    cfg = Config.load(profile="cpu", config_file=user, overrides=["grpo.group_size=8", "optim.lr=1e-5"])
    assert cfg.grpo.group_size == 8
    assert cfg.grpo.kl_coef == 0.05
    assert cfg.run.name == "mine"
    assert cfg.optim.lr == 1e-5
    assert cfg.model.name == "tiny-8h"  # the profile's, untouched by the user file


def test_json_config_file_is_accepted(tmp_path: Path) -> None:
    user = tmp_path / "user.json"
    user.write_text('{"sampling": {"temperature": 0.7}}')
    assert Config.load(config_file=user).sampling.temperature == 0.7


def test_override_values_are_parsed_as_yaml() -> None:
    assert parse_override("tools.offline=[finance, calculator]") == {
        "tools": {"offline": ["finance", "calculator"]}
    }
    cfg = Config.load(
        overrides=["tools.offline=[finance, calculator]", "grpo.dual_clip=3", "grpo.filter_zero_std=false"]
    )
    assert cfg.tools.source == OfflineServers(names=("finance", "calculator"))
    assert cfg.grpo.dual_clip == 3.0
    assert isinstance(cfg.grpo.dual_clip, float)
    assert cfg.grpo.filter_zero_std is False


def test_partial_mapping_override_keeps_other_keys() -> None:
    cfg = Config.load(profile=None, overrides=["env.max_turns_by_difficulty.easy=3"])
    assert cfg.env.max_turns_by_difficulty == {"easy": 3, "medium": 8, "hard": 10}


def test_choosing_a_tools_source_replaces_the_profile_source() -> None:
    cfg = Config.load(overrides=["tools.servers=servers.json"])
    assert cfg.tools.source == ServersFile(path="servers.json")
    assert cfg.tools.allow_tools == {}  # the profile's allow-lists named the replaced source's servers
    own = Config.load(overrides=["tools.servers=servers.json", "tools.allow_tools={calc: [add]}"])
    assert own.tools.allow_tools == {"calc": ("add",)}
    inline = Config.load(overrides=['tools.mcp_servers={"calc": {"command": "python"}}'])
    assert inline.tools.source == InlineServers(servers={"calc": {"command": "python"}})


def test_two_tools_sources_in_one_layer_are_rejected() -> None:
    with pytest.raises(ConfigError, match="one tools source"):
        Config.from_dict({"tools": {"servers": "a.json", "offline": ["finance"]}})


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("grpo.grup_size=3", "unknown config key 'grpo.grup_size'; did you mean 'grpo.group_size'"),
        ("gpro.group_size=3", "unknown config key 'gpro'; did you mean 'grpo'"),
        ("group_size=3", "did you mean 'grpo.group_size'"),
        ("grpo.group_size=abc", "grpo.group_size: got 'abc'; expected an integer"),
        ("grpo.group_size=1", "grpo.group_size: expected a value >= 2, got 1"),
        ("model.dtype=fp8", "model.dtype: got 'fp8'; expected one of 'float32', 'bfloat16', 'float16'"),
        ("distributed.zero_stage=4", "distributed.zero_stage: got 4; expected one of 0, 1, 2, 3"),
        ("model.device=gpu", "model.device: expected auto, cpu, cuda, cuda:N or mps, got 'gpu'"),
        ("optim.betas=[0.9]", "optim.betas: got \\[0.9\\]; expected a list of 2 values"),
        ("sampling.top_p=1.5", "sampling.top_p: must be in \\(0, 1\\], got 1.5"),
        ("quantization=nf4", "quantization: 'nf4' needs LoRA adapters"),
        ("grpo.estimator=ppo", "grpo.estimator: got 'ppo'; expected one of"),
        ("env.max_turns_by_difficulty.expert=3", "env.max_turns_by_difficulty: needs exactly the keys"),
        ("run.name=a/b", "run.name: expected a directory name"),
        (
            "grpo.kl_in_reward=true",
            "grpo.kl_in_reward: true needs per-token rewards \\(grpo.estimator=gae\\)",
        ),
        ("reference.ema=0.5", "reference.ema: 0.5 has no effect with reference.every=0"),
        ("reference.every=5", "reference.every: no reference policy exists with grpo.kl_coef=0"),
        ("reference.ema=1.5", "reference.ema"),
        ("grpo.tis=0", "grpo.tis"),
        ("grpo", "expected section.key=value"),
    ],
)
def test_bad_keys_and_values_name_the_key_and_the_expectation(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.load(overrides=[override])


def test_reference_and_kl_in_reward_are_refused_where_they_cannot_apply() -> None:
    with pytest.raises(ConfigError, match="a LoRA run's reference is the base model"):
        Config.load(overrides=["grpo.kl_coef=0.01", "lora={}", "reference.every=5"])
    with pytest.raises(ConfigError, match=r"grpo.kl_in_reward: true needs grpo.kl_coef > 0"):
        Config.load(overrides=["grpo.estimator=gae", "grpo.kl_in_reward=true"])
    gae = Config.load(
        overrides=[
            "grpo.estimator=gae",
            "model.value_head=true",
            "grpo.kl_in_reward=true",
            "grpo.kl_coef=0.05",
            "collection.overlap=false",  # GAE's π_old is the learner's, not the sampler's
        ]
    )
    assert gae.grpo.kl_in_reward
    ema = Config.load(overrides=["grpo.kl_coef=0.01", "reference.every=5", "reference.ema=0.9"])
    assert (ema.reference.every, ema.reference.ema) == (5, 0.9)
    assert Config.load(profile="a100x2").reference.every == 100


def test_vllm_sleep_is_refused_without_vllm_or_beside_overlap() -> None:
    with pytest.raises(ConfigError, match=r"sampler.vllm_sleep: true with sampler.backend=hf"):
        Config.load(overrides=["sampler.vllm_sleep=true"])
    with pytest.raises(ConfigError, match=r"with collection.overlap: true: the engine would sleep"):
        Config.load(
            profile="vllm-gpu",
            overrides=["sampler.vllm_sleep=true", "collection.overlap=true", "grpo.minibatches=1"],
        )
    assert Config.load(profile="vllm-gpu", overrides=["sampler.vllm_sleep=true"]).sampler.vllm_sleep


def test_unknown_profile_suggests_the_nearest() -> None:
    with pytest.raises(ConfigError, match="unknown profile 'cpuu'; did you mean 'cpu'"):
        Config.load(profile="cpuu")


def test_unreadable_or_malformed_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Config.load(config_file=tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="expected a mapping"):
        Config.load(config_file=bad)


def test_replace_applies_overrides_to_a_resolved_config() -> None:
    cfg = Config.load(profile="a100x2").replace(["run.steps=3"])
    assert cfg.run.steps == 3
    assert cfg.distributed.zero_stage == 3


def test_exponent_without_a_dot_is_a_number(tmp_path: Path) -> None:
    user = tmp_path / "user.yaml"
    user.write_text("optim:\n  lr: 3e-6\n")
    assert Config.load(config_file=user).optim.lr == 3e-6


def test_library_options_are_reachable_from_set() -> None:
    cfg = Config.load(
        overrides=[
            "env.reward.weights={outcome: 1.0}",
            "env.on_template_drift=report",
            "env.chat_template_kwargs={enable_thinking: false}",
            "sampling.top_k=20",
            "lora.r=8",
        ]
    )
    assert cfg.env.reward.weights == {"outcome": 1.0}
    assert cfg.env.on_template_drift == "report"
    assert cfg.env.chat_template_kwargs == {"enable_thinking": False}
    assert cfg.sampling.top_k == 20
    assert cfg.lora is not None
    assert cfg.lora.r == 8
    assert Config.from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "env.reward.wieghts={}",
            "unknown config key 'env.reward.wieghts'; did you mean 'env.reward.weights'",
        ),
        ("env.reward.weights={outcom: 1.0}", "env.reward.weights: unknown reward function 'outcom'"),
        ("env.max_total_tokens=8", "env.max_total_tokens: expected a value >= 16, got 8"),
        (
            "env.on_template_drift=ignore",
            "env.on_template_drift: got 'ignore'; expected one of 'raise', 'report'",
        ),
        ("lora.dropout=1.0", "lora.dropout: expected a value < 1.0, got 1.0"),
        ("sampling.seed=3", "sampling.seed: got 3; expected null"),
        ("sampling.temperature=0", "sampling.temperature: expected a value > 0"),
        ("grpo.aggregation=dr_grpo", "grpo.aggregation: got 'dr_grpo'; expected one of 'token-mean'"),
        ("tools.ofline=[finance]", "unknown config key 'tools.ofline'; did you mean 'tools.offline'"),
    ],
)
def test_library_validators_fail_as_config_errors_naming_the_key(override: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Config.load(overrides=[override])
