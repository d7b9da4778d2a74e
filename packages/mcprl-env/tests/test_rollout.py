"""Episode scenarios with the scripted sampler and in-process servers."""

from __future__ import annotations

import anyio
import pytest
from env_testkit import call, crashy_manager, make_task, memory_manager

from mcprl_env import EnvConfig, Environment, Episode, Sampler, Task
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager

pytestmark = pytest.mark.anyio


async def run(
    manager: ToolManager, script: list[str] | Sampler, *, task: Task | None = None, **config: object
) -> Episode:
    tok = CharTokenizer()
    sampler = ScriptedSampler(tok, script) if isinstance(script, list) else script
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(**config))  # type: ignore[arg-type]
    return await env.run_episode(task or make_task(), sampler)


async def test_multi_turn_success_is_rewarded_and_token_exact(manager: ToolManager) -> None:
    ep = await run(manager, [call("multiply", a=3, b=4.5), "<answer>13.5</answer>"])
    assert (ep.stop_reason, ep.valid, ep.success, ep.answer) == ("answer", True, True, "13.5")
    assert ep.messages[2] == {"role": "tool", "name": "multiply", "content": "13.5"}
    assert ep.metrics["turns"] == 2
    assert ep.metrics["tool_calls"] == 1
    assert ep.metrics["tool_calls_ok"] == 1
    assert ep.reward == pytest.approx(sum(ep.reward_components.values()))
    assert ep.reward_components["outcome"] == 1.0
    assert ep.reward_components["forced"] == 0.0
    assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.sampler_logprobs)


async def test_wrong_answer_is_valid_but_unsuccessful(manager: ToolManager) -> None:
    ep = await run(manager, [call("multiply", a=3, b=4.5), "<answer>12</answer>"])
    assert (ep.stop_reason, ep.valid, ep.success) == ("answer", True, False)
    assert ep.reward_components["outcome"] == 0.0


async def test_malformed_call_becomes_an_observation_and_is_counted(manager: ToolManager) -> None:
    ep = await run(manager, ['<tool_call>{"name": "multiply", "arguments": {"a": 3,}</tool_call>', "13.5"])
    assert ep.valid
    assert ep.success
    assert ep.stop_reason == "answer"
    assert ep.messages[2]["role"] == "tool"
    assert "invalid tool call (invalid_json)" in ep.messages[2]["content"]
    assert ep.metrics["parse_errors"] == 1
    assert ep.metrics["parse_errors/invalid_json"] == 1
    assert ep.metrics["invalid_calls"] == 1
    assert ep.reward_components["invalid_call"] < 0
    assert ep.reward_components["format"] == 0.0


async def test_unknown_tool_is_rejected_without_calling_the_manager(manager: ToolManager) -> None:
    ep = await run(manager, [call("launch_rockets", n=1), "13.5"])
    assert ep.valid
    assert ep.metrics["tool_errors/unknown_tool"] == 1
    assert "unknown tool 'launch_rockets'" in ep.messages[2]["content"]
    assert "multiply" in ep.messages[2]["content"]


async def test_tool_outside_the_task_allow_list_is_unknown(manager: ToolManager) -> None:
    task = make_task(tools=["multiply"])
    ep = await run(manager, [call("divide", a=1, b=2), "13.5"], task=task)
    assert ep.metrics["tool_errors/unknown_tool"] == 1
    assert "divide" not in ep.messages[2]["content"].partition("Available tools:")[2]


async def test_schema_invalid_arguments_are_a_model_fault(manager: ToolManager) -> None:
    ep = await run(manager, [call("multiply", a="three"), "13.5"])
    assert ep.valid
    assert ep.metrics["tool_errors/invalid_arguments"] == 1
    assert ep.metrics["invalid_calls"] == 1


async def test_tool_error_is_shown_but_not_an_invalid_call(manager: ToolManager) -> None:
    ep = await run(manager, [call("divide", a=1, b=0), "13.5"])
    assert ep.valid
    assert ep.metrics["tool_errors/tool_error"] == 1
    assert ep.metrics["invalid_calls"] == 0
    assert "division by zero" in ep.messages[2]["content"]


async def test_several_calls_in_one_turn_run_and_answer_in_order(manager: ToolManager) -> None:
    turn = call("multiply", a=2, b=3) + "\n" + call("divide", a=9, b=3) + call("multiply", a=1, b=1)
    ep = await run(manager, [turn, "13.5"])
    assert [m["content"] for m in ep.messages[2:5]] == ["6", "3", "1"]
    assert ep.metrics["tool_calls"] == 3


async def test_calls_over_the_per_turn_cap_are_not_run(manager: ToolManager) -> None:
    turn = "".join(call("multiply", a=i, b=1) for i in range(4))
    ep = await run(manager, [turn, "13.5"], max_calls_per_turn=2)
    assert [m["content"] for m in ep.messages[2:4]] == ["0", "1"]
    assert ep.metrics["tool_errors/too_many_calls"] == 2


async def test_infra_error_ends_the_episode_invalid_without_raising() -> None:
    async with memory_manager(call_timeout=0.3) as manager:
        ep = await run(manager, [call("hang"), "13.5"])
    assert (ep.valid, ep.stop_reason, ep.reward, ep.success) == (False, "infra_error", 0.0, False)
    assert ep.error is not None
    assert "timeout" in ep.error
    assert ep.metrics["infra_errors"] == 1
    assert all(v == 0.0 for v in ep.reward_components.values())


async def test_server_crash_marks_the_episode_invalid_and_nothing_raises() -> None:
    async with crashy_manager() as manager:
        ep = await run(manager, [call("crash"), "done"], task=make_task(servers=["crashy"]))
    assert (ep.valid, ep.stop_reason) == (False, "infra_error")
    assert ep.error is not None
    assert ep.error.startswith("crash:")


async def test_max_turns_stops_a_model_that_never_answers(manager: ToolManager) -> None:
    ep = await run(manager, [call("multiply", a=1, b=1)])
    assert (ep.stop_reason, ep.valid, ep.metrics["turns"]) == ("max_turns", True, 5)
    assert ep.reward_components["forced"] < 0
    assert ep.answer is None
    hard = await run(manager, [call("multiply", a=1, b=1)], task=make_task(difficulty="hard"))
    assert hard.metrics["turns"] == 10
    own = await run(manager, [call("multiply", a=1, b=1)], task=make_task(max_turns=2))
    assert own.metrics["turns"] == 2


async def test_runaway_tool_calls_stop_at_the_episode_cap(manager: ToolManager) -> None:
    turn = "".join(call("multiply", a=1, b=1) for _ in range(3))
    ep = await run(manager, [turn], max_tool_calls=7, max_calls_per_turn=8, task=make_task(max_turns=100))
    assert ep.stop_reason == "max_tool_calls"
    assert ep.metrics["turns"] == 3


async def test_consecutive_invalid_turns_stop_the_episode(manager: ToolManager) -> None:
    ep = await run(
        manager, ["<tool_call>nope</tool_call>"], max_consecutive_invalid=3, task=make_task(max_turns=50)
    )
    assert ep.stop_reason == "consecutive_invalid"
    assert ep.metrics["turns"] == 3
    assert ep.metrics["invalid_turns"] == 3
    assert ep.valid


async def test_token_budget_bounds_every_turn_and_stops(manager: ToolManager) -> None:
    tok = CharTokenizer()
    sampler = ScriptedSampler(tok, [call("big", n=50)])
    ep = await run(manager, sampler, max_total_tokens=2200, task=make_task(max_turns=100))
    assert ep.stop_reason == "token_budget"
    assert len(ep.token_ids) <= 2200
    assert ep.metrics["turns"] >= 2
    assert all(max_new <= 2200 - len(prompt) for prompt, max_new in sampler.calls)


async def test_a_turn_cut_by_the_per_turn_cap_stops_with_sampler_length(manager: ToolManager) -> None:
    ep = await run(manager, ["x" * 100], max_new_tokens_per_turn=20)
    assert ep.stop_reason == "sampler_length"
    assert ep.answer is None
    assert sum(ep.loss_mask) == 20


async def test_tool_output_is_truncated_by_tokens_with_a_marker(manager: ToolManager) -> None:
    ep = await run(manager, [call("big", n=1000, char="é"), "13.5"], max_tool_output_tokens=40)
    content = ep.messages[2]["content"]
    assert content.startswith("é" * 40)
    assert content.endswith("[truncated: 40 of 1000 tokens shown]")
    assert ep.metrics["truncated_outputs"] == 1


async def test_sampler_failure_is_recorded_not_raised(manager: ToolManager) -> None:
    tok = CharTokenizer()
    ep = await run(manager, ScriptedSampler(tok, [call("multiply", a=1, b=2), RuntimeError("gpu fell off")]))
    assert (ep.valid, ep.stop_reason) == (False, "error")
    assert ep.error == "RuntimeError: gpu fell off"
    assert ep.metrics["turns"] == 1


async def test_the_hard_limit_ends_an_episode_whose_sampler_never_answers_invalid(
    manager: ToolManager,
) -> None:
    class Stuck:
        async def sample(self, prompt_ids: object, *, max_new_tokens: int, seed: int | None = None) -> object:
            await anyio.Event().wait()
            raise AssertionError("unreachable")

    with anyio.fail_after(10):
        ep = await run(manager, Stuck(), episode_timeout_s=0.2)  # type: ignore[arg-type]
    # Nothing was served: the episode's own time never ran out, the hard limit (4 x 0.2 s) did.
    assert (ep.stop_reason, ep.valid, ep.reward) == ("queue_timeout", False, 0.0)
    assert ep.error is not None
    assert "hard limit of 0.8 s" in ep.error
    assert ep.metrics["turns"] == 0
    assert ep.metrics["wall_s"] >= 0.8


async def test_message_posted_checker_reads_the_episodes_own_state(manager: ToolManager) -> None:
    task = make_task(
        servers=["messaging"],
        answer=None,
        checker={"type": "message_posted", "channel": "general", "contains": "13.5"},
    )
    good = await run(
        manager, [call("post_message", channel="general", text="It is 13.5"), "posted"], task=task
    )
    assert good.success
    assert good.valid
    # Same task, different episode id: the post above is not visible to it.
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok)
    other = await env.run_episode(task, ScriptedSampler(tok, ["I did nothing"]), index=1)
    assert not other.success
    assert other.valid


async def test_unknown_server_in_a_task_is_an_invalid_episode(manager: ToolManager) -> None:
    ep = await run(manager, ["13.5"], task=make_task(tools=["no_such_tool"]))
    assert (ep.valid, ep.stop_reason) == (False, "error")
    assert ep.error is not None
    assert "no_such_tool" in ep.error
