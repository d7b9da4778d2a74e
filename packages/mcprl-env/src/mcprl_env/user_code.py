"""Checkers and reward functions written by users: ``module:function`` specs, imported once, called safely.

A spec names a function in a Python file (``my_checks.py:grade``, a path relative to a base directory: the
task file's for a task's checker, the current directory for reward weights) or in an installed module
(``my_pkg.checks:grade``). `load_user_function` imports it at start-up, so a typo fails before any model
loads; `call_user_function` calls it with a `FinishedEpisode`, awaiting it when it is a coroutine function,
and turns any exception into a `UserCodeError` carrying the traceback: a bug in a checker is the user's,
never scored as the model's failure. A sync function runs on the episodes' event loop, so it should be quick.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

import attrs

from mcprl_env.errors import CheckerInfraError, UserCodeError, UserCodeImportError
from mcprl_env.finished import FinishedEpisode

__all__ = ["UserFunction", "call_user_function", "is_user_spec", "load_user_function"]

UserCallable = Callable[[FinishedEpisode], object | Awaitable[object]]
"""What a spec names: ``f(episode) -> value`` or ``async f(episode) -> value``."""

_MODULES: dict[str, ModuleType] = {}
_LOCK = threading.Lock()


@attrs.frozen(kw_only=True)
class UserFunction:
    """A user function, resolved.

    Attributes:
        spec: The spec as written (``checks.py:grade``).
        origin: The absolute file it came from, or the module name.
        function: The function itself.
    """

    spec: str
    origin: str
    function: UserCallable = attrs.field(eq=False, repr=False)


def is_user_spec(name: str) -> bool:
    """Whether ``name`` has the ``module:function`` shape (built-in names have no colon)."""
    return ":" in name


def _split(spec: str) -> tuple[str, str]:
    module, sep, function = spec.rpartition(":")
    if not sep or not module or not function.isidentifier():
        raise UserCodeImportError(
            f"{spec!r}: expected 'file.py:function' or 'package.module:function' (a Python identifier after "
            "the last ':')"
        )
    return module, function


def _import_file(path: Path) -> ModuleType:
    key = str(path)
    with _LOCK:
        cached = _MODULES.get(key)
        if cached is not None:
            return cached
        digest = hashlib.sha1(key.encode()).hexdigest()[:12]
        # A top-level name: pickle (DeepSpeed all-gathers episode groups, tasks included) imports it by name.
        name = f"mcprl_user_code_{path.stem}_{digest}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise UserCodeImportError(f"{path}: not importable as a Python file")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses and pickling look their module up here
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
        _MODULES[key] = module
        return module


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} (line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}"


def load_user_function(spec: str, *, base_dir: str | Path | None = None) -> UserFunction:
    """Import the function a spec names (each file or module is imported once per process).

    Args:
        spec: ``path/to/file.py:function`` or ``package.module:function``.
        base_dir: Directory a relative file path is resolved against (None: the current directory).

    Raises:
        UserCodeImportError: The spec is malformed, the file does not exist, importing it raised (the error
            names the file and the exception), or it has no callable of that name.
    """
    module_part, function_name = _split(spec)
    if module_part.endswith(".py"):
        path = Path(module_part)
        if not path.is_absolute():
            path = Path(base_dir if base_dir is not None else Path.cwd()) / path
        path = path.resolve()
        if not path.is_file():
            raise UserCodeImportError(f"{spec!r}: no such file {str(path)!r}")
        origin = str(path)
        try:
            module = _import_file(path)
        except Exception as exc:
            raise UserCodeImportError(f"{spec!r}: importing {origin} raised {_describe(exc)}") from exc
    else:
        origin = module_part
        try:
            module = importlib.import_module(module_part)
        except Exception as exc:
            raise UserCodeImportError(f"{spec!r}: cannot import module {origin!r}: {_describe(exc)}") from exc
    function: object = getattr(module, function_name, None)
    if not callable(function):
        public = sorted(
            n
            for n, v in vars(module).items()
            if inspect.isfunction(v) and v.__module__ == module.__name__ and not n.startswith("_")
        )
        raise UserCodeImportError(
            f"{spec!r}: {origin} has no function {function_name!r} (its functions: {', '.join(public) or 'none'})"
        )
    return UserFunction(spec=spec, origin=origin, function=function)


async def call_user_function(user: UserFunction, episode: FinishedEpisode) -> object:
    """Call ``user.function(episode)``, awaiting the result when it is awaitable.

    Raises:
        UserCodeError: The function raised; the error names the spec and the task and holds the traceback.
        CheckerInfraError: The function said its check could not run (passed through: not a bug in it).
    """
    try:
        result = user.function(episode)
        if inspect.isawaitable(result):
            result = await result
    except CheckerInfraError:
        raise
    except Exception as exc:
        raise UserCodeError(
            f"{user.spec} raised {type(exc).__name__}: {exc}",
            spec=user.spec,
            task_id=episode.task.id,
            traceback_text="".join(traceback.format_exception(exc)),
        ) from exc
    return result
