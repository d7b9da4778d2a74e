"""A run fixes the date dated chat templates print: on creation, in ``config.yaml``, for its warm start and episodes.

The template is Llama 3.2's as Meta publishes it, on the real Llama 3 vocabulary (`mcprl_policy.standin`). The
clock is transformers' own: its template environment's ``strftime_now`` reads ``datetime.now()`` in
``transformers.utils.chat_template_utils``, which the ``clock`` fixture sets (the only stand-in here: the real
clock cannot be moved to another day in a test).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any

import pytest

from mcprl_env import EnvConfig, Transcript
from mcprl_env.testing import ScriptedCompletion
from mcprl_train.commands.train import _open_run  # pyright: ignore[reportPrivateUsage]
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError
from mcprl_train.loop.warm_start import render_example
from mcprl_train.run.run_dir import RunDir

DAY_1 = datetime.date(2025, 6, 30)
TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]
CALL = json.dumps({"name": "multiply", "parameters": {"a": 3, "b": 4.5}})


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> list[datetime.datetime]:
    """``[now]`` inside transformers' template environment; assign ``clock[0]`` to move it."""
    pytest.importorskip("transformers")
    from transformers.utils import chat_template_utils

    now = [datetime.datetime.combine(DAY_1, datetime.time(12))]

    class _Patched(datetime.datetime):
        @classmethod
        def now(cls, tz: datetime.tzinfo | None = None) -> datetime.datetime:  # type: ignore[override]
            del tz
            return now[0]

    monkeypatch.setattr(chat_template_utils, "datetime", _Patched)
    return now


def _llama_3_2(chat_templates_dir: Path) -> Any:
    pytest.importorskip("gguf", reason="the Llama 3 vocabulary is read from a .gguf file: pip install gguf")
    from mcprl_policy.standin import llama_tokenizer

    template = (chat_templates_dir / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
    return llama_tokenizer(
        chat_templates_dir / "ggml-vocab-llama-bpe.gguf", release="llama3.1", chat_template=template
    )


def _episode_ids(tok: Any, kwargs: dict[str, Any]) -> tuple[list[int], list[int], list[dict[str, Any]]]:
    transcript = Transcript(tok, template_kwargs=kwargs)
    transcript.start([{"role": "user", "content": "What is 3 times 4.5?"}], tools=TOOLS)
    for n, text in enumerate((CALL, "<answer>13.5</answer>")):
        ids = [*tok.encode(text, add_special_tokens=False), tok.eos_token_id]
        transcript.add_sampled(
            ScriptedCompletion(token_ids=ids, logprobs=[-1.0] * len(ids), text=text, finish_reason="stop")
        )
        if n == 0:
            transcript.commit_env(transcript.env_suffix([{"role": "tool", "content": "13.5"}]))
    return transcript.token_ids, transcript.loss_mask, transcript.messages


def test_a_demonstration_rendered_a_day_before_the_episode_is_its_ids_only_with_a_template_date(
    chat_templates_dir: Path, clock: list[datetime.datetime]
) -> None:
    tok = _llama_3_2(chat_templates_dir)
    for config in (EnvConfig(), EnvConfig(template_date=DAY_1)):
        clock[0] = datetime.datetime.combine(DAY_1 + datetime.timedelta(days=1), datetime.time(12))
        ids, mask, messages = _episode_ids(tok, config.template_kwargs())
        clock[0] = datetime.datetime.combine(DAY_1, datetime.time(12))
        demo = render_example(
            tok, messages, TOOLS, template_kwargs=config.template_kwargs(), end_of_turn={tok.eos_token_id}
        )
        same = demo.token_ids[: len(ids)] == ids and demo.assistant_mask[: len(mask)] == mask
        assert same is (config.template_date is not None)
        shown = "Today Date: 30 Jun 2025\n" if config.template_date else "Today Date: 01 Jul 2025\n"
        assert shown in tok.decode(ids)


def test_a_new_run_records_today_and_its_config_file_keeps_it_for_a_resume(tmp_path: Path) -> None:
    config = Config.load(overrides=[f"run.output_dir={tmp_path}", "run.name=dated"])
    assert config.env.template_date is None
    config, run_dir, resume = _open_run(config, None)
    assert (config.env.template_date, resume) == (datetime.date.today(), False)
    assert f"template_date: '{datetime.date.today().isoformat()}'" in run_dir.config_path.read_text()
    assert RunDir.open(run_dir.path).load_config().env.template_date == datetime.date.today()


def test_a_template_date_set_by_the_user_is_the_runs(tmp_path: Path) -> None:
    # Unquoted, YAML reads the value as a date; quoted, as a string: both are the date.
    for value in ("2025-06-30", "'2025-06-30'"):
        assert Config.load(overrides=[f"env.template_date={value}"]).env.template_date == DAY_1
    config = Config.load(overrides=[f"run.output_dir={tmp_path}", "env.template_date=2025-06-30"])
    config, run_dir, _ = _open_run(config, None)
    assert config.env.template_date == DAY_1
    assert RunDir.open(run_dir.path).load_config().env.template_date == DAY_1
    with pytest.raises(ConfigError, match=r"env\.template_date: got '30/06/2025'; expected a date"):
        Config.load(overrides=["env.template_date=30/06/2025"])
