"""The judge's verdict rule (strict JSON) and rubric rendering."""

from __future__ import annotations

import pytest

from mcprl_env.finished import ToolCallRecord
from mcprl_env.judge_rubric import parse_verdict, render_tool_calls


def test_the_verdict_rule_is_strict() -> None:
    assert parse_verdict('{"correct": true, "reason": "ok"}').correct is True
    assert (
        parse_verdict('<think>hmm {"a": 1}</think>\n```json\n{"correct": false, "reason": "no"}\n```').reason
        == "no"
    )
    for bad, why in [
        ("PASS", "not one JSON object"),
        ('Verdict: {"correct": true, "reason": "ok"}', "not one JSON object"),
        ('[{"correct": true, "reason": "ok"}]', "a JSON list"),
        ('{"correct": true}', "expected exactly"),
        ('{"correct": true, "reason": "ok", "score": 1}', "expected exactly"),
        ('{"correct": 1, "reason": "ok"}', "must be true/false"),
        ('{"correct": true, "reason": "a"} {"correct": false, "reason": "b"}', "not one JSON object"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_verdict(bad)


def test_tool_calls_render_one_line_each_with_results_cut() -> None:
    calls = (
        ToolCallRecord(
            turn=1, name="get_quote", arguments={"symbol": "X"}, ok=True, error_type=None, result="1" * 13
        ),
        ToolCallRecord(
            turn=2, name="nope", arguments={}, ok=False, error_type="unknown_tool", result="no such tool"
        ),
    )
    assert render_tool_calls(calls, 12).splitlines() == [
        '1. get_quote({"symbol": "X"}) -> ok: 111111111111 …[truncated]',
        "2. nope({}) -> error (unknown_tool): no such tool",
    ]
    assert render_tool_calls((), 4) == "(no tool calls)"
