"""Templates that print today's date render the same text on every day once the date is fixed.

The templates are the vendors' own (scripts/fetch-chat-templates.py), rendered by transformers'
``apply_chat_template``. The clock is transformers' own: its template environment's ``strftime_now`` reads
``datetime.now()`` in ``transformers.utils.chat_template_utils``, which the ``clock`` fixture sets to a day of
the test's choosing (the only stand-in here: the real clock cannot be moved across midnight in a test).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest
from env_testkit import make_task
from real_templates import tokenizer_with_template

from mcprl_env import ConfigError, EnvConfig, Environment, TemplateDriftError, Transcript
from mcprl_env.template_clock import fixed_strftime_now
from mcprl_env.testing import ScriptedCompletion, ScriptedSampler
from mcprl_tools import ToolManager

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

LLAMA_3_2 = "meta-llama-Llama-3.2-3B-Instruct.jinja"
LLAMA_EOS = "<|eot_id|>"
LLAMA_HEADER = "<|start_header_id|>assistant<|end_header_id|>"
# Every cached template that prints the date through strftime_now, and the day 1 date as it prints it.
DATED_TEMPLATES: dict[str, str] = {
    LLAMA_3_2: "Today Date: 30 Jun 2025",
    "Mistral-Small-3.2-24B-Instruct-2506.jinja": "The current date is 2025-06-30.",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "Today's Date: June 30, 2025.",
    "openai-gpt-oss-120b.jinja": "Current date: 2025-06-30",
    "Apertus-8B-Instruct.jinja": "Current date: 2025-06-30",
}
DAY_1 = datetime.date(2025, 6, 30)
CONVERSATION = [{"role": "user", "content": "What is 3 times 4.5?"}]


class Clock:
    """What ``datetime.now()`` returns inside transformers' template environment."""

    def __init__(self) -> None:
        self.now = datetime.datetime.combine(DAY_1, datetime.time(23, 59))

    def next_day(self) -> None:
        self.now += datetime.timedelta(days=1)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    from transformers.utils import chat_template_utils

    state = Clock()

    class _Patched(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
            del tz
            return state.now

    monkeypatch.setattr(chat_template_utils, "datetime", _Patched)
    return state


def _render(tok: Any, config: EnvConfig) -> str:
    text = tok.apply_chat_template(
        CONVERSATION, tokenize=False, add_generation_prompt=True, **config.template_kwargs()
    )
    assert isinstance(text, str)
    return text


@pytest.mark.parametrize("template", sorted(DATED_TEMPLATES))
def test_a_dated_template_renders_the_same_on_the_next_day_only_with_a_template_date(
    chat_templates_dir: Path, clock: Clock, template: str
) -> None:
    tok = tokenizer_with_template((chat_templates_dir / template).read_text())
    live, fixed = EnvConfig(), EnvConfig(template_date=DAY_1)
    before = (_render(tok, live), _render(tok, fixed))
    clock.next_day()
    after = (_render(tok, live), _render(tok, fixed))
    assert DATED_TEMPLATES[template] in before[0]
    assert after[0] != before[0]
    assert DATED_TEMPLATES[template] not in after[0]
    assert after[1] == before[1] == before[0]


def test_llama_3_2_prints_the_template_date_and_a_date_string_still_wins(
    chat_templates_dir: Path, clock: Clock
) -> None:
    tok = tokenizer_with_template((chat_templates_dir / LLAMA_3_2).read_text())
    assert "Today Date: 02 Jan 2024\n" in _render(tok, EnvConfig(template_date="2024-01-02"))
    chosen = EnvConfig(template_date=DAY_1, chat_template_kwargs={"date_string": "26 Jul 2024"})
    assert "Today Date: 26 Jul 2024\n" in _render(tok, chosen)


def _llama_turn(tok: Any) -> ScriptedCompletion:
    text = json.dumps({"name": "multiply", "parameters": {"a": 3, "b": 4.5}})
    ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
    return ScriptedCompletion(token_ids=ids, logprobs=[0.0] * len(ids), text=text, finish_reason="stop")


def test_a_turn_sampled_across_midnight_is_drift_without_a_template_date(
    chat_templates_dir: Path, clock: Clock
) -> None:
    tok = tokenizer_with_template((chat_templates_dir / LLAMA_3_2).read_text(), LLAMA_EOS)
    tools = [{"type": "function", "function": {"name": "multiply", "description": "x", "parameters": {}}}]
    response = [{"role": "tool", "content": "13.5"}]
    for config in (EnvConfig(), EnvConfig(template_date=DAY_1)):
        clock.now = datetime.datetime.combine(DAY_1, datetime.time(23, 59))
        transcript = Transcript(tok, template_kwargs=config.template_kwargs())
        transcript.start(CONVERSATION, tools=tools)
        clock.next_day()
        transcript.add_sampled(_llama_turn(tok))
        if config.template_date is None:
            with pytest.raises(TemplateDriftError):
                transcript.env_suffix(response)
        else:
            transcript.commit_env(transcript.env_suffix(response))
            assert transcript.text.count("Today Date: 30 Jun 2025\n") == 1


class _MidnightSampler(ScriptedSampler):
    """Samples each turn a day after the previous one."""

    def __init__(self, tok: Any, clock: Clock, script: list[str]) -> None:
        super().__init__(tok, script, assistant_header=LLAMA_HEADER)
        self._clock = clock

    async def sample(
        self, prompt_ids: Any, *, max_new_tokens: int, seed: int | None = None
    ) -> ScriptedCompletion:
        self._clock.next_day()
        return await super().sample(prompt_ids, max_new_tokens=max_new_tokens, seed=seed)


@pytest.mark.anyio
async def test_an_environment_fixes_the_date_it_was_created_on_for_its_episodes(
    chat_templates_dir: Path, clock: Clock, manager: ToolManager
) -> None:
    tok = tokenizer_with_template((chat_templates_dir / LLAMA_3_2).read_text(), LLAMA_EOS)
    script = [
        json.dumps({"name": "multiply", "parameters": {"a": 3, "b": 4.5}}),
        json.dumps({"name": "divide", "parameters": {"a": 27, "b": 2}}),
        "<answer>13.5</answer>",
    ]
    env = Environment(manager=manager, tokenizer=tok)
    assert env.config.template_date == datetime.date.today()
    env = Environment(manager=manager, tokenizer=tok, config=EnvConfig(template_date=DAY_1))
    episode = await env.run_episode(make_task(), _MidnightSampler(tok, clock, script))
    assert (episode.valid, episode.stop_reason, episode.metrics["template_drift"]) == (True, "answer", 0.0)
    assert episode.metrics["turns"] == 3.0
    assert tok.decode(episode.token_ids).count("Today Date: 30 Jun 2025\n") == 1


def test_template_date_reads_an_iso_date_and_rejects_anything_else() -> None:
    assert EnvConfig(template_date="2025-06-30").template_date == DAY_1
    assert "strftime_now" not in EnvConfig().template_kwargs()
    assert EnvConfig(template_date=DAY_1).template_kwargs()["strftime_now"]("%d %b %Y") == "30 Jun 2025"
    with pytest.raises(ConfigError, match="expected YYYY-MM-DD"):
        EnvConfig(template_date="30/06/2025")
    with pytest.raises(ConfigError, match="must be a date"):
        EnvConfig(template_date=datetime.datetime(2025, 6, 30, 12))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="set template_date"):
        EnvConfig(chat_template_kwargs={"strftime_now": "2025-06-30"})


def test_the_fixed_clock_formats_midnight_of_its_day() -> None:
    assert fixed_strftime_now(DAY_1)("%Y-%m-%d %H:%M") == "2025-06-30 00:00"
