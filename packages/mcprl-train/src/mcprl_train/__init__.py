"""The training app: profiles, GRPO loop, checkpoints, tracking."""

from mcprl_train.config import Config, list_profiles
from mcprl_train.errors import ConfigError, InvalidRateError, RatioHealthError, RolloutError, TrainError

__all__ = [
    "Config",
    "ConfigError",
    "InvalidRateError",
    "RatioHealthError",
    "RolloutError",
    "TrainError",
    "list_profiles",
]
