"""Outcome checkers."""

from __future__ import annotations

import pytest
from env_testkit import make_task

from mcprl_env import check_outcome, extract_number, normalize_text
from mcprl_env.checkers import mentions
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("370.35", 370.35),
        ("$1,234.50", 1234.5),
        ("The answer is 42.", 42.0),
        ("-3e2", -300.0),
        ("from 3 to 7", 7.0),
        ("no digits", None),
        ("inf", None),
    ],
)
def test_extract_number(text: str, value: float | None) -> None:
    assert extract_number(text) == value


def test_normalize_text_folds_case_and_whitespace() -> None:
    assert normalize_text("  Hello \n  WORLD ") == "hello world"


async def test_each_answer_checker(manager: ToolManager) -> None:
    numeric = make_task(answer="370.35", checker={"type": "numeric", "abs_tol": 0.005})
    assert (await check_outcome(numeric, "about 370.353", manager=manager, episode_id="e")).correct
    assert not (await check_outcome(numeric, "370.4", manager=manager, episode_id="e")).correct
    assert not (await check_outcome(numeric, None, manager=manager, episode_id="e")).correct
    exact = make_task(answer="New  York", checker={"type": "exact"})
    assert (await check_outcome(exact, "new york ", manager=manager, episode_id="e")).correct
    assert not (await check_outcome(exact, "New York City", manager=manager, episode_id="e")).correct
    contains = make_task(answer="ACME", checker={"type": "contains"})
    assert (await check_outcome(contains, "It is acme corp", manager=manager, episode_id="e")).correct


async def test_message_posted_checker_is_per_episode(manager: ToolManager) -> None:
    task = make_task(
        answer=None, checker={"type": "message_posted", "channel": "general", "contains": "PRICE 12"}
    )
    await manager.call("post_message", {"channel": "general", "text": "the price 12 today"}, episode_id="a")
    assert (await check_outcome(task, None, manager=manager, episode_id="a")).correct
    assert not (await check_outcome(task, None, manager=manager, episode_id="b")).correct


async def test_an_unreachable_state_server_is_an_infra_error_not_a_wrong_answer(manager: ToolManager) -> None:
    task = make_task(
        answer=None, checker={"type": "message_posted", "server": "nowhere", "channel": "g", "contains": "x"}
    )
    result = await check_outcome(task, None, manager=manager, episode_id="a")
    assert not result.correct
    # An unknown tool is the manager's tool_error (not infra): the check just fails.
    assert result.infra_error is None


@pytest.mark.parametrize(
    ("text", "needle", "expected"),
    [
        ("ACME is at 3.2 today", "3.2", True),
        ("ACME is at 3.2.", "3.2", True),
        ("price: $3.2", "3.2", True),
        ("ACME is at 3.25", "3.2", False),
        ("ACME is at 13.2", "3.2", False),
        ("3.23.2", "3.2", False),
        ("posted PRICE 12 now", "price 12", True),
        ("PRICE 120", "price 12", False),
    ],
)
def test_message_needles_match_whole_words_and_numbers(text: str, needle: str, expected: bool) -> None:
    assert mentions(text, needle) is expected
