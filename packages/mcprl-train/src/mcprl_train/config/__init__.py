"""The run's config: typed sections, shipped profiles, and the layers that resolve them."""

from mcprl_train.config.layers import parse_override
from mcprl_train.config.tree import (
    DEFAULT_PROFILE,
    Config,
    DistributedConfig,
    EnvSection,
    EvalConfig,
    GRPOConfig,
    LoraConfig,
    ModelConfig,
    OptimConfig,
    RewardSection,
    RunConfig,
    SamplerConfig,
    SFTConfig,
    TasksConfig,
    ToolsConfig,
    TrackingConfig,
    list_profiles,
)

__all__ = [
    "DEFAULT_PROFILE",
    "Config",
    "DistributedConfig",
    "EnvSection",
    "EvalConfig",
    "GRPOConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimConfig",
    "RewardSection",
    "RunConfig",
    "SFTConfig",
    "SamplerConfig",
    "TasksConfig",
    "ToolsConfig",
    "TrackingConfig",
    "list_profiles",
    "parse_override",
]
