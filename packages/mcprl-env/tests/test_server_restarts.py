"""A stateful server killed mid-episode: the episodes that used it are invalid, never scored on lost state.

Real stdio processes of the offline app servers (RELIABILITY.md scenario 19); skipped when mcprl-servers is
not installed (mcprl-env alone).
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest
from env_testkit import call

from mcprl_env import Completion, Environment, task_from_dict
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ServersConfig, ToolManager

pytest.importorskip("mcprl_servers")

pytestmark = pytest.mark.anyio

_MARKER = "MCPRL_ENV_TEST_MARKER"


def _servers(marker: str) -> ServersConfig:
    def entry(module: str, *, stateful: bool) -> dict[str, object]:
        return {
            "command": sys.executable,
            "args": ["-m", module],
            "env": {_MARKER: marker},
            "stateful": stateful,
            "restart": {"backoff_initial": 0.05},
        }

    return ServersConfig.from_dict(
        {
            "mcpServers": {
                "messaging": entry("mcprl_servers.messaging", stateful=True),
                "calculator": entry("mcprl_servers.calculator", stateful=False),
            }
        },
        source="<test>",
    )


def _kill(marker: str, module: str) -> int:
    """SIGKILL the live server process running `module` with the marker; how many were killed."""
    needle = f"{_MARKER}={marker}".encode()
    killed = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if needle in environ and module.encode() in cmdline:
            os.kill(int(entry), signal.SIGKILL)
            killed += 1
    return killed


POST = task_from_dict(
    {
        "id": "post",
        "prompt": "Post the total to #general.",
        "servers": ["messaging"],
        "checker": {"type": "message_posted", "channel": "general", "contains": "370.35"},
    }
)
CALC = task_from_dict(
    {
        "id": "calc",
        "prompt": "Compute 3*123.45.",
        "servers": ["calculator"],
        "answer": "370.35",
        "checker": {"type": "numeric"},
    }
)


class _KillAtTurnOne:
    """Samples `turns`; the last of `group` episodes to reach turn 1 kills `server`'s process and waits
    (through real probe calls) until the new process serves; only then do the episodes go on."""

    def __init__(
        self,
        manager: ToolManager,
        tok: CharTokenizer,
        marker: str,
        *,
        server: str,
        probe: tuple[str, dict[str, object]],
        turns: list[str],
        group: int = 1,
    ) -> None:
        self._inner = ScriptedSampler(tok, turns)
        self._manager, self._tok, self._marker = manager, tok, marker
        self._server, self._probe, self._group = server, probe, group
        self._arrived = 0
        self._restarted = anyio.Event()
        self.killed = 0
        self.generations: list[int | None] = []

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Completion:
        turn = self._tok.decode(list(prompt_ids)).count("<|im_start|>assistant") - 1
        if turn == 1:
            self._arrived += 1
            if self._arrived == self._group:
                self.killed = _kill(self._marker, f"mcprl_servers.{self._server}")
                with anyio.fail_after(30):
                    while not self.generations or self.generations[-1] != 2:
                        probe = await self._manager.call(*self._probe)
                        self.generations.append(probe.generation)
                self._restarted.set()
            await self._restarted.wait()
        return await self._inner.sample(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)


ANSWER = "<answer>posted</answer>"
POSTED = [call("post_message", channel="general", text="370.35"), ANSWER]


async def test_episodes_that_posted_before_a_stateful_restart_are_invalid_not_failed() -> None:
    marker = uuid.uuid4().hex
    tok = CharTokenizer()
    async with ToolManager(_servers(marker)) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        sampler = _KillAtTurnOne(
            manager,
            tok,
            marker,
            server="messaging",
            probe=("messaging.list_channels", {}),
            turns=POSTED,
            group=4,
        )
        group = await env.run_group(POST, sampler, group_size=4)
        fresh = await env.run_episode(POST, ScriptedSampler(tok, POSTED), index=9)
        restarts = manager.metrics()["tools/messaging/restarts"]
    assert (sampler.killed, restarts, sampler.generations[-1]) == (1, 1, 2)
    # Every episode posted the right message on the first process and was checked on the second: without
    # generations they would all read an empty channel and be scored as the model's failure.
    for ep in group.episodes:
        assert (ep.valid, ep.success, ep.stop_reason, ep.reward) == (False, False, "server_restarted", 0.0)
        assert ep.error is not None
        assert "'messaging' restarted during the episode (session 1 -> 2)" in ep.error
    # An episode that lives entirely on the new process is scored as usual.
    assert (fresh.valid, fresh.success, fresh.stop_reason) == (True, True, "answer")


async def test_a_kill_while_the_check_is_in_flight_is_invalid_too() -> None:
    marker = uuid.uuid4().hex
    tok = CharTokenizer()
    killed: list[int] = []

    def script(prompt: str, turn: int) -> str:
        del prompt
        if turn == 0:
            return call("post_message", channel="general", text="The total is 370.35")
        if not killed:
            killed.append(_kill(marker, "mcprl_servers.messaging"))
        return ANSWER

    async with ToolManager(_servers(marker)) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        group = await env.run_group(POST, ScriptedSampler(tok, script), group_size=4)
    assert killed == [1]
    outcomes = [(ep.valid, ep.success, ep.stop_reason) for ep in group.episodes]
    # Mis-scored: valid yet unsuccessful, although every episode posted the right message.
    assert [o for o in outcomes if o[0] and not o[1]] == [], outcomes
    assert any(not ep.valid for ep in group.episodes)
    assert {ep.stop_reason for ep in group.episodes if not ep.valid} <= {"infra_error", "server_restarted"}


async def test_a_stateless_server_restarting_mid_episode_invalidates_nothing() -> None:
    marker = uuid.uuid4().hex
    tok = CharTokenizer()
    turns = [call("calculate", expression="3*123.45")] * 2 + ["<answer>370.35</answer>"]
    async with ToolManager(_servers(marker)) as manager:
        env = Environment(manager=manager, tokenizer=tok)
        sampler = _KillAtTurnOne(
            manager, tok, marker, server="calculator", probe=("calculate", {"expression": "1"}), turns=turns
        )
        episode = await env.run_episode(CALC, sampler)
        restarts = manager.metrics()["tools/calculator/restarts"]
    assert (sampler.killed, restarts, sampler.generations[-1]) == (1, 1, 2)
    assert (episode.valid, episode.success, episode.stop_reason) == (True, True, "answer")
    assert episode.metrics["tool_calls_ok"] == 2
