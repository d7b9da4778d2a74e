"""The run's config: typed sections, shipped profiles, and the layers that resolve them."""

from mcprl_train.config.layers import parse_override
from mcprl_train.config.sections import (
    CollectionConfig,
    DistributedConfig,
    Estimator,
    EvalConfig,
    GRPOConfig,
    ModelConfig,
    OptimConfig,
    RunConfig,
    SamplerConfig,
    SFTConfig,
    TasksConfig,
    TrackingConfig,
)
from mcprl_train.config.tools import InlineServers, OfflineServers, ServersFile, ToolsConfig, ToolSource
from mcprl_train.config.tree import DEFAULT_PROFILE, Config, list_profiles

__all__ = [
    "DEFAULT_PROFILE",
    "CollectionConfig",
    "Config",
    "DistributedConfig",
    "Estimator",
    "EvalConfig",
    "GRPOConfig",
    "InlineServers",
    "ModelConfig",
    "OfflineServers",
    "OptimConfig",
    "RunConfig",
    "SFTConfig",
    "SamplerConfig",
    "ServersFile",
    "TasksConfig",
    "ToolSource",
    "ToolsConfig",
    "TrackingConfig",
    "list_profiles",
    "parse_override",
]
