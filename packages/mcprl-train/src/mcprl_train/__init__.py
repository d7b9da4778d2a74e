"""The training app: profiles, GRPO loop, checkpoints, tracking.

Only the config and the errors are re-exported here, so ``import mcprl_train`` (and ``mcprl-train config``)
stays light; the run directory, checkpoints, plan, doctor, tracking and the loop live in their modules.
"""

from mcprl_train.config import Config, list_profiles
from mcprl_train.errors import (
    CheckpointError,
    ConfigError,
    DistributedError,
    InvalidRateError,
    PlanError,
    RatioHealthError,
    RunDirError,
    TrackingError,
    TrainError,
)

__all__ = [
    "CheckpointError",
    "Config",
    "ConfigError",
    "DistributedError",
    "InvalidRateError",
    "PlanError",
    "RatioHealthError",
    "RunDirError",
    "TrackingError",
    "TrainError",
    "list_profiles",
]
