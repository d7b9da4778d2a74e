"""The typed config tree of a training run, its profiles and its overrides.

A run's config is resolved in layers, later layers winning key by key (deep merge):

1. the defaults of the attrs classes (the seeds' hyperparameters where they make sense),
2. a profile shipped with the package (``profiles/<name>.yaml``: ``cpu`` is the default),
3. a user file (``--config FILE``, YAML or JSON),
4. ``--set section.key=value`` overrides (values parsed as YAML scalars/flow: ``3``, ``0.1``, ``true``,
   ``null``, ``[a, b]``).

The tree composes the libraries' own configs as they are: ``env`` is `mcprl_env.EnvConfig` (with its
``reward``), ``lora`` is `mcprl_policy.LoraSettings` (null: no adapters), ``sampling`` is
`mcprl_policy.SamplingParams`; every key of theirs is reachable from ``--set`` (``env.reward.weights``,
``sampling.top_k``). Unknown keys are an error naming the key path and the nearest valid key; wrong values
are an error naming the key, the value and what was expected. ``Config.to_dict()`` is the resolved config a
run saves.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import attrs
import yaml

from mcprl_env.config import EnvConfig
from mcprl_policy.config import LoraSettings, Quantization, SamplingParams
from mcprl_train.config.layers import (
    deep_merge,
    is_dict,
    is_mapping,
    parse_override,
    plain_data,
    read_config_file,
)
from mcprl_train.config.sections import (
    CollectionConfig,
    DistributedConfig,
    EvalConfig,
    GRPOConfig,
    ModelConfig,
    OptimConfig,
    ReferenceConfig,
    RunConfig,
    SamplerConfig,
    SFTConfig,
    TasksConfig,
    TrackingConfig,
)
from mcprl_train.config.structure import structure_class
from mcprl_train.config.tools import SOURCE_KEYS, ToolsConfig
from mcprl_train.errors import ConfigError

__all__ = ["DEFAULT_PROFILE", "Config", "list_profiles"]

DEFAULT_PROFILE = "cpu"


@attrs.frozen(kw_only=True)
class Config:
    """The resolved config of a run: one frozen section per concern.

    Build it with `Config.load` (profile + file + overrides) or `Config.from_dict`; save it with `to_dict`.
    ``lora`` set (even to ``{}``) trains LoRA adapters; ``quantization`` loads the base model in 4 bit (QLoRA:
    needs ``lora``). ``sampling`` is how rollouts sample; its seed is derived per step from ``run.seed``.
    """

    profile: str = DEFAULT_PROFILE
    quantization: Quantization | None = None
    model: ModelConfig = attrs.field(factory=ModelConfig)
    lora: LoraSettings | None = None
    sampling: SamplingParams = attrs.field(factory=SamplingParams)
    sampler: SamplerConfig = attrs.field(factory=SamplerConfig)
    tools: ToolsConfig = attrs.field(factory=ToolsConfig)
    tasks: TasksConfig = attrs.field(factory=TasksConfig)
    env: EnvConfig = attrs.field(factory=EnvConfig)
    collection: CollectionConfig = attrs.field(factory=CollectionConfig)
    grpo: GRPOConfig = attrs.field(factory=GRPOConfig)
    reference: ReferenceConfig = attrs.field(factory=ReferenceConfig)
    optim: OptimConfig = attrs.field(factory=OptimConfig)
    sft: SFTConfig = attrs.field(factory=SFTConfig)
    eval: EvalConfig = attrs.field(factory=EvalConfig)
    run: RunConfig = attrs.field(factory=RunConfig)
    tracking: TrackingConfig = attrs.field(factory=TrackingConfig)
    distributed: DistributedConfig = attrs.field(factory=DistributedConfig)

    def __attrs_post_init__(self) -> None:
        if self.quantization is not None and self.lora is None:
            raise ConfigError(
                f"quantization: {self.quantization!r} needs LoRA adapters (a 4-bit base model is frozen; only "
                "adapters train): set lora, e.g. lora={} or lora.r=16"
            )
        if self.sampling.temperature <= 0.0:
            raise ConfigError(
                f"sampling.temperature: expected a value > 0 for training rollouts, got "
                f"{self.sampling.temperature!r} (evaluation is greedy with eval.greedy=true)"
            )
        if self.sampling.seed is not None:
            raise ConfigError(
                f"sampling.seed: got {self.sampling.seed!r}; expected null (the sampler's seed is derived per "
                "step from run.seed: set run.seed)"
            )
        self._check_kl_and_reference()
        if self.grpo.estimator == "gae" and not self.model.value_head:
            raise ConfigError("grpo.estimator: 'gae' needs model.value_head=true")
        if self.distributed.backend == "none" and self.distributed.zero_stage != 0:
            raise ConfigError("distributed.zero_stage: a ZeRO stage needs distributed.backend=deepspeed")
        self._check_deepspeed_precision()
        self._check_overlap()
        self._check_vllm_sleep()
        self._check_vllm_replica()
        if self.optim.compile and self.distributed.backend != "none":
            raise ConfigError(
                f"optim.compile: true with distributed.backend={self.distributed.backend}: compiled layers are "
                "wired into the one-process update only; set optim.compile=false"
            )
        if self.optim.layout == "prefix_grouped" and self.distributed.backend != "none":
            raise ConfigError(
                f"optim.layout: prefix_grouped with distributed.backend={self.distributed.backend}: its backbone "
                "calls per micro-batch depend on the rank's sequences, and ZeRO-3 needs the same calls on every "
                "rank; set optim.layout=padded or packed"
            )
        if self.optim.layout == "prefix_grouped" and self.model.gradient_checkpointing:
            raise ConfigError(
                "optim.layout: prefix_grouped with model.gradient_checkpointing: true: transformers drops the "
                "prefixes' keys/values under checkpointing; set optim.layout=padded or turn checkpointing off"
            )

    def _check_vllm_replica(self) -> None:
        """Under DeepSpeed each rank's vLLM engine is its sampling copy: a replica beside it would be a third."""
        ds = self.distributed
        if ds.backend == "deepspeed" and self.sampler.backend == "vllm" and ds.sampling == "replica":
            raise ConfigError(
                "distributed.sampling=replica with sampler.backend=vllm: each rank's vLLM engine already holds "
                "its own copy of the weights, loaded from the engine's (gathered) weights after every update; "
                "set distributed.sampling=engine"
            )

    def _check_vllm_sleep(self) -> None:
        """Sleep mode frees the vLLM engine's memory during the update: only vLLM has it, and nothing may sample then."""
        if not self.sampler.vllm_sleep:
            return
        if self.sampler.backend != "vllm":
            raise ConfigError(
                f"sampler.vllm_sleep: true with sampler.backend={self.sampler.backend}: sleep mode is vLLM's "
                "(the HF sampler holds no engine memory of its own); set sampler.backend=vllm or drop it"
            )
        if self.collection.overlap:
            raise ConfigError(
                "sampler.vllm_sleep: true with collection.overlap: true: the engine would sleep through the "
                "update while the next step's collection samples from it; choose one"
            )

    def _check_deepspeed_precision(self) -> None:
        """Under DeepSpeed, its bf16 mode is the mixed precision: it must agree with ``model.dtype``."""
        ds, model = self.distributed, self.model
        if ds.backend != "deepspeed":
            return
        if ds.bf16 != (model.dtype == "bfloat16"):
            raise ConfigError(
                f"distributed.bf16={str(ds.bf16).lower()} with model.dtype={model.dtype}: under DeepSpeed the two "
                "go together (bf16 with fp32 master weights kept by DeepSpeed, or float32 without bf16)"
            )
        if ds.bf16 and not model.master_weights:
            raise ConfigError(
                "model.master_weights=false: DeepSpeed's bf16 always keeps fp32 master weights and optimizer "
                "states; bf16-true runs in one process (distributed.backend=none)"
            )

    def _check_overlap(self) -> None:
        """Overlap samples a step behind: π_old must be the sampler's (or TIS must weigh against it)."""
        grpo = self.grpo
        if not self.collection.overlap:
            return
        if self.distributed.backend != "none":
            raise ConfigError(
                f"collection.overlap: true with distributed.backend={self.distributed.backend}: the update's "
                "collectives and the collection's all-gathers would run from two threads, in an order that may "
                "differ between ranks (and the collection would need weights the update does not change: "
                "distributed.sampling=replica); set collection.overlap=false"
            )
        if grpo.recomputes_old_logprobs and grpo.tis is None:
            raise ConfigError(
                f"collection.overlap: true recomputes π_old with the learner's newer weights here (grpo.ppo_epochs="
                f"{grpo.ppo_epochs}, grpo.minibatches={grpo.minibatches}, grpo.estimator={grpo.estimator}, "
                f"grpo.old_logprobs={grpo.old_logprobs}), so nothing would correct for the step the sampler lags "
                "behind: set grpo.tis (e.g. grpo.tis=2.0), or use the sampler's logprobs (grpo.old_logprobs=sampler, "
                "grpo.ppo_epochs=1, grpo.minibatches=1, a group estimator), or learn on-policy: collection.overlap=false"
            )

    def _check_kl_and_reference(self) -> None:
        grpo, ref = self.grpo, self.reference
        if grpo.kl_in_reward and grpo.estimator != "gae":
            raise ConfigError(
                f"grpo.kl_in_reward: true needs per-token rewards (grpo.estimator=gae); the {grpo.estimator!r} "
                "estimator takes one outcome reward per episode: keep the KL in the loss (grpo.kl_in_reward=false "
                "with grpo.kl_coef > 0)"
            )
        if grpo.kl_in_reward and grpo.kl_coef <= 0:
            raise ConfigError("grpo.kl_in_reward: true needs grpo.kl_coef > 0 (the penalty's β)")
        if ref.ema > 0 and ref.every == 0:
            raise ConfigError(
                f"reference.ema: {ref.ema} has no effect with reference.every=0 (the reference never moves); "
                "set reference.every"
            )
        if ref.every > 0 and grpo.kl_coef <= 0:
            raise ConfigError(
                "reference.every: no reference policy exists with grpo.kl_coef=0; set grpo.kl_coef > 0 or "
                "reference.every=0"
            )
        if ref.every > 0 and self.lora is not None:
            raise ConfigError(
                "reference.every: a LoRA run's reference is the base model with the adapters disabled and cannot "
                "follow the policy by EMA or re-sync; set reference.every=0 (or lora=null for a full fine-tune)"
            )

    @classmethod
    def load(
        cls,
        profile: str | None = DEFAULT_PROFILE,
        config_file: str | Path | None = None,
        overrides: Sequence[str] = (),
    ) -> Config:
        """Resolve defaults ← ``profile`` (None: none) ← ``config_file`` ← ``overrides`` (module docstring).

        Raises:
            ConfigError: unknown profile, unreadable file, unknown key, or invalid value.
        """
        data: dict[str, Any] = {}
        if profile is not None:
            data = _merge_layer(data, _profile_data(profile))
            data["profile"] = profile
        if config_file is not None:
            data = _merge_layer(data, read_config_file(Path(config_file)))
        for item in overrides:
            data = _merge_layer(data, parse_override(item))
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: object) -> Config:
        """Validate a (partial) config tree; missing keys take their defaults.

        Raises:
            ConfigError: unknown key (naming the nearest valid one) or invalid value.
        """
        if not is_mapping(data):
            raise ConfigError(f"config: expected a mapping at the top level, got {type(data).__name__}")
        return structure_class(_fill_turns(data), cls, "")

    def to_dict(self, *, redact: bool = False) -> dict[str, Any]:
        """The resolved tree as plain YAML/JSON-able data (tuples become lists).

        Args:
            redact: Replace the secrets written literally in inline servers' ``env``/``headers``
                (`mcprl_tools.config.is_literal_secret`) with ``***``: for whatever is written or printed.
        """
        data: dict[str, Any] = plain_data(attrs.asdict(self, recurse=True))
        data["tools"] = self.tools.to_data(redact=redact)
        return data

    def to_yaml(self) -> str:
        """The resolved tree as YAML, secrets redacted (what ``mcprl-train config`` prints and every run saves)."""
        return yaml.safe_dump(self.to_dict(redact=True), sort_keys=False)

    def replace(self, overrides: Sequence[str]) -> Config:
        """A copy with ``section.key=value`` overrides applied (validated like `load`)."""
        data = self.to_dict()
        for item in overrides:
            data = _merge_layer(data, parse_override(item))
        return Config.from_dict(data)


def list_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    root = resources.files("mcprl_train.config") / "profiles"
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def _profile_data(name: str) -> dict[str, Any]:
    path = resources.files("mcprl_train.config") / "profiles" / f"{name}.yaml"
    if not path.is_file():
        known = list_profiles()
        near = difflib.get_close_matches(name, known, n=1)
        hint = f"; did you mean {near[0]!r}?" if near else ""
        raise ConfigError(f"unknown profile {name!r}{hint} (known: {', '.join(known)})")
    data: object = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not is_dict(data):
        raise ConfigError(f"profile {name!r}: expected a mapping")
    return data


def _merge_layer(base: Mapping[str, Any], layer: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``layer`` over ``base``; a layer naming a tools source replaces the other sources.

    The earlier layers' ``tools.allow_tools`` narrowed the servers of the source being replaced, so it goes
    with it (a layer that names a source may give its own allow-lists). A layer of inline servers over
    inline servers merges into them (``--set tools.mcp_servers.NAME.env.KEY=VALUE`` sets one value).
    """
    tools = layer.get("tools")
    base_tools = base.get("tools")
    if is_mapping(tools) and is_mapping(base_tools):
        chosen = [k for k in SOURCE_KEYS if tools.get(k) is not None]
        inline_over_inline = chosen == ["mcp_servers"] and base_tools.get("mcp_servers") is not None
        if chosen and not inline_over_inline:
            dropped = {*SOURCE_KEYS, "allow_tools"}
            base = {**base, "tools": {k: v for k, v in base_tools.items() if k not in dropped}}
    return deep_merge(base, layer)


def _fill_turns(data: Mapping[str, Any]) -> Mapping[str, Any]:
    """``env.max_turns_by_difficulty`` has a fixed key set: keys not given keep `EnvConfig`'s defaults.

    So ``--set env.max_turns_by_difficulty.easy=3`` sets one limit (EnvConfig itself wants all three).
    """
    env = data.get("env")
    if not is_mapping(env):
        return data
    turns = env.get("max_turns_by_difficulty")
    if not is_mapping(turns):
        return data
    filled = {**EnvConfig().max_turns_by_difficulty, **turns}
    return {**data, "env": {**env, "max_turns_by_difficulty": filled}}
