"""Multi-turn environment: tasks, tool-call parsing, token-exact episodes, reward shaping."""

from mcprl_env.access import ToolAccess
from mcprl_env.checkers import CheckResult, check_outcome, extract_number, normalize_text
from mcprl_env.config import DEFAULT_REWARD_WEIGHTS, EnvConfig, RewardConfig
from mcprl_env.environment import Environment, episode_id_for, group_id_for
from mcprl_env.episode import Episode, EpisodeGroup, StopReason
from mcprl_env.errors import (
    CheckerInfraError,
    ConfigError,
    EnvError,
    JudgeError,
    ParseErrorKind,
    TaskValidationError,
    TemplateDriftError,
    ToolCallParseError,
    UnknownToolCallFormatError,
    UserCodeError,
    UserCodeImportError,
)
from mcprl_env.finished import FinishedEpisode, ToolCallRecord
from mcprl_env.loaders import TaskFormat, TaskSet, iter_tasks
from mcprl_env.metrics import EpisodeStats, aggregate_metrics
from mcprl_env.parsing import (
    HermesToolCallParser,
    Llama3JsonToolCallParser,
    ParsedTurn,
    QwenXmlToolCallParser,
    ToolCall,
    ToolCallParser,
    detect_parser_family,
    get_parser,
    parser_families,
    register_parser,
    resolve_parser,
)
from mcprl_env.protocols import ChatTokenizer, Completion, Sampler, ToolCaller, ToolOutcome, ToolSpecLike
from mcprl_env.rewards import RewardContext, RewardFunction, combine_rewards, register_reward_function
from mcprl_env.rollout import run_episode
from mcprl_env.seeds import derive_seed, turn_seed
from mcprl_env.tasks import (
    Checker,
    ContainsChecker,
    Difficulty,
    ExactChecker,
    MessagePostedChecker,
    NumericChecker,
    PythonChecker,
    Task,
    checker_from_dict,
    checker_to_dict,
    task_from_dict,
)
from mcprl_env.transcript import Transcript
from mcprl_env.user_code import UserFunction, load_user_function

__all__ = [
    "DEFAULT_REWARD_WEIGHTS",
    "ChatTokenizer",
    "CheckResult",
    "Checker",
    "CheckerInfraError",
    "Completion",
    "ConfigError",
    "ContainsChecker",
    "Difficulty",
    "EnvConfig",
    "EnvError",
    "Environment",
    "Episode",
    "EpisodeGroup",
    "EpisodeStats",
    "ExactChecker",
    "FinishedEpisode",
    "HermesToolCallParser",
    "JudgeError",
    "Llama3JsonToolCallParser",
    "MessagePostedChecker",
    "NumericChecker",
    "ParseErrorKind",
    "ParsedTurn",
    "PythonChecker",
    "QwenXmlToolCallParser",
    "RewardConfig",
    "RewardContext",
    "RewardFunction",
    "Sampler",
    "StopReason",
    "Task",
    "TaskFormat",
    "TaskSet",
    "TaskValidationError",
    "TemplateDriftError",
    "ToolAccess",
    "ToolCall",
    "ToolCallParseError",
    "ToolCallParser",
    "ToolCallRecord",
    "ToolCaller",
    "ToolOutcome",
    "ToolSpecLike",
    "Transcript",
    "UnknownToolCallFormatError",
    "UserCodeError",
    "UserCodeImportError",
    "UserFunction",
    "aggregate_metrics",
    "check_outcome",
    "checker_from_dict",
    "checker_to_dict",
    "combine_rewards",
    "derive_seed",
    "detect_parser_family",
    "episode_id_for",
    "extract_number",
    "get_parser",
    "group_id_for",
    "iter_tasks",
    "load_user_function",
    "normalize_text",
    "parser_families",
    "register_parser",
    "register_reward_function",
    "resolve_parser",
    "run_episode",
    "task_from_dict",
    "turn_seed",
]
