"""Process sandbox for model-written Python: configuration, runner and the in-child supervisor."""

from mcprl_servers.sandbox.config import Isolation, SandboxConfig
from mcprl_servers.sandbox.runner import RunOutcome, run_sandboxed

__all__ = ["Isolation", "RunOutcome", "SandboxConfig", "run_sandboxed"]
