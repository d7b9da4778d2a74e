"""Importing user checkers and reward functions: file and module specs, and the errors a typo gives."""

from __future__ import annotations

import json
import pickle
import textwrap
from pathlib import Path

import pytest

from mcprl_env import (
    ConfigError,
    EnvConfig,
    PythonChecker,
    RewardConfig,
    TaskSet,
    TaskValidationError,
    UserCodeImportError,
    load_user_function,
    task_from_dict,
)


def write(path: Path, source: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source), encoding="utf-8")
    return path


def test_a_file_spec_is_found_relative_to_the_base_directory(tmp_path: Path) -> None:
    write(tmp_path / "checks.py", "def grade(episode):\n    return True\n")
    user = load_user_function("checks.py:grade", base_dir=tmp_path)
    assert user.origin == str((tmp_path / "checks.py").resolve())
    assert user.spec == "checks.py:grade"
    assert callable(user.function)


def test_a_file_is_imported_once_per_process(tmp_path: Path) -> None:
    write(tmp_path / "counted.py", "def a(episode):\n    return True\n")
    first = load_user_function("counted.py:a", base_dir=tmp_path)
    again = load_user_function(str(tmp_path / "counted.py") + ":a")
    assert first.function is again.function


def test_a_module_spec_imports_an_installed_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "site" / "acme_checks" / "__init__.py", "")
    write(tmp_path / "site" / "acme_checks" / "grading.py", "async def grade(episode):\n    return False\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    user = load_user_function("acme_checks.grading:grade")
    assert user.origin == "acme_checks.grading"


@pytest.mark.parametrize("spec", ["grade", "checks.py:", ":grade", "checks.py:not-a-name"])
def test_a_malformed_spec_says_what_shape_is_expected(spec: str) -> None:
    with pytest.raises(UserCodeImportError, match=r"expected 'file\.py:function'"):
        load_user_function(spec)


def test_a_missing_file_names_the_path_it_looked_for(tmp_path: Path) -> None:
    with pytest.raises(UserCodeImportError, match=r"no such file .*chekcs\.py"):
        load_user_function("chekcs.py:grade", base_dir=tmp_path)


def test_a_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    write(tmp_path / "broken.py", "def grade(episode):\n    return (\n")
    with pytest.raises(UserCodeImportError, match=r"broken\.py raised SyntaxError: .*\(line \d\)"):
        load_user_function("broken.py:grade", base_dir=tmp_path)


def test_an_import_error_inside_the_file_is_reported_with_the_file(tmp_path: Path) -> None:
    write(tmp_path / "needs.py", "import definitely_not_installed_pkg\ndef grade(e): ...\n")
    with pytest.raises(UserCodeImportError, match=r"needs\.py raised ModuleNotFoundError"):
        load_user_function("needs.py:grade", base_dir=tmp_path)


def test_a_missing_function_lists_the_functions_the_file_has(tmp_path: Path) -> None:
    write(tmp_path / "checks2.py", "def grade(e): ...\ndef brevity(e): ...\n")
    with pytest.raises(UserCodeImportError, match=r"no function 'grad' \(its functions: brevity, grade\)"):
        load_user_function("checks2.py:grad", base_dir=tmp_path)


def test_a_missing_module_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"cannot import module 'no_such_pkg_xyz\.mod'"):
        load_user_function("no_such_pkg_xyz.mod:grade")


def test_task_file_python_checker_resolves_next_to_the_task_file(tmp_path: Path) -> None:
    write(tmp_path / "family" / "grading.py", "def grade(episode):\n    return True\n")
    path = tmp_path / "family" / "tasks.jsonl"
    task = {"id": "t1", "prompt": "p", "checker": {"type": "python", "function": "grading.py:grade"}}
    path.write_text(json.dumps(task) + "\n", encoding="utf-8")
    (loaded,) = list(TaskSet(path))
    assert isinstance(loaded.checker, PythonChecker)
    assert loaded.checker.resolved.origin == str((tmp_path / "family" / "grading.py").resolve())
    assert loaded.answer is None
    assert loaded.to_dict()["checker"] == {"type": "python", "function": "grading.py:grade"}


def test_a_task_with_a_python_checker_pickles_by_reference(tmp_path: Path) -> None:
    write(tmp_path / "grading4.py", "def grade(episode):\n    return True\n")
    raw = {"id": "a", "prompt": "p", "checker": {"type": "python", "function": "grading4.py:grade"}}
    task = task_from_dict(raw, base_dir=tmp_path)
    again = pickle.loads(pickle.dumps(task))
    assert again == task
    assert isinstance(again.checker, PythonChecker)
    assert isinstance(task.checker, PythonChecker)
    assert again.checker.resolved.function is task.checker.resolved.function


def test_a_task_set_default_checker_applies_to_tasks_that_name_none(tmp_path: Path) -> None:
    write(tmp_path / "grading5.py", "def grade(episode):\n    return True\n")
    default = load_user_function("grading5.py:grade", base_dir=tmp_path)
    path = tmp_path / "tasks.jsonl"
    rows = [
        {"id": "a", "prompt": "p"},
        {"id": "b", "prompt": "p", "answer": "1", "checker": {"type": "exact"}},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    checker = PythonChecker(function="grading5.py:grade", resolved=default)
    first, second = TaskSet(path, default_checker=checker)
    assert (first.checker, second.checker.type) == (checker, "exact")
    with pytest.raises(TaskValidationError, match="required by the exact checker"):
        list(TaskSet(path))


def test_a_checker_typo_fails_indexing_with_file_line_and_field(tmp_path: Path) -> None:
    write(tmp_path / "grading3.py", "def grade(episode):\n    return True\n")
    good = {"id": "a", "prompt": "p", "checker": {"type": "python", "function": "grading3.py:grade"}}
    bad = {"id": "b", "prompt": "p", "checker": {"type": "python", "function": "grading3.py:grdae"}}
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n", encoding="utf-8")
    with pytest.raises(TaskValidationError) as info:
        TaskSet(path).build_index()
    assert (info.value.line, info.value.index, info.value.field) == (2, 1, "checker.function")
    assert "no function 'grdae'" in str(info.value)
    assert str(path) in str(info.value)


def test_python_checker_needs_a_function() -> None:
    with pytest.raises(TaskValidationError, match=r"file\.py:function") as info:
        task_from_dict({"id": "a", "prompt": "p", "checker": {"type": "python"}})
    assert info.value.field == "checker.function"


def test_reward_weight_with_a_spec_is_imported_when_the_config_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(tmp_path / "shaping.py", "def brevity(episode):\n    return 0.5\n")
    monkeypatch.chdir(tmp_path)
    config = EnvConfig(reward=RewardConfig(weights={"outcome": 1.0, "shaping.py:brevity": 0.2}))
    assert config.reward.weights["shaping.py:brevity"] == 0.2
    with pytest.raises(ConfigError, match=r"no function 'brevty'"):
        RewardConfig(weights={"shaping.py:brevty": 1.0})
    with pytest.raises(ConfigError, match=r"no such file"):
        RewardConfig(weights={"shapng.py:brevity": 1.0})
