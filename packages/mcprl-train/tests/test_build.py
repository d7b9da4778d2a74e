"""What `mcprl_train.build` makes from a config: the warm-start demonstrations, the tiny-profile warning."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest

from mcprl_train.build import load_demos
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError
from mcprl_train.loop.demo_file import Demonstration


def _demos(*overrides: str) -> list[Demonstration]:
    config = Config.load("cpu", overrides=["sft.demos=60", "sft.teacher_noise=1.0", *overrides])
    return load_demos(config)


def _retries(messages: list[dict[str, Any]]) -> int:
    return sum(m["role"] == "tool" and "Unknown symbol" in m["content"] for m in messages)


def test_teacher_typos_add_a_recovered_lookup_to_some_demonstrations() -> None:
    plain = _demos()
    typos = _demos("sft.teacher_typos=1.0")
    assert [d.task_id for d in plain] == [d.task_id for d in typos]  # the same tasks, in the same order
    assert sum(_retries(d.messages) for d in plain) == 0
    assert all(_retries(d.messages) <= 1 for d in typos)
    assert sum(_retries(d.messages) for d in typos) >= 30


def test_demonstrations_are_the_same_in_every_run() -> None:
    assert _demos("sft.teacher_typos=0.3") == _demos("sft.teacher_typos=0.3")


def test_a_real_model_on_the_tiny_models_profile_is_told_what_it_inherits() -> None:
    from mcprl_train.build import tiny_profile_warning

    assert tiny_profile_warning(Config.load(profile="cpu")) is None
    assert tiny_profile_warning(Config.load(profile="single-gpu-lora")) is None
    real = Config.load(profile="cpu", overrides=["model.name=Qwen/Qwen3-0.6B"])
    warning = tiny_profile_warning(real)
    assert warning is not None
    assert "model.name='Qwen/Qwen3-0.6B' inherits env.max_new_tokens_per_turn=64" in warning
    assert "optim.lr=0.0003" in warning
    tuned = real.replace(["env.max_new_tokens_per_turn=512", "optim.lr=1e-6"])
    warning = tiny_profile_warning(tuned)
    assert warning is not None
    assert "max_new_tokens_per_turn" not in warning
    assert "optim.lr" not in warning
    assert "env.max_total_tokens=1024" in warning


def _family(demo: Demonstration) -> str:
    return demo.task_id.rsplit("-train-", 1)[0]


def test_family_weights_set_each_family_s_share_of_the_demonstrations() -> None:
    plain = Counter(_family(d) for d in _demos())
    assert sum(plain.values()) == 60
    assert len(plain) == 4
    mixed = _demos("sft.family_weights={quote_ratio: 3}")
    assert Counter(_family(d) for d in mixed) == {
        "quote": 10,
        "quote-mul": 10,
        "post-quote": 10,
        "quote-ratio": 30,
    }


def test_family_noise_gives_one_family_the_ideal_script() -> None:
    import mcprl_tasks

    train = mcprl_tasks.read_tasks(mcprl_tasks.load_preset("demo")[0])
    by_id = {str(t["id"]): t for t in train}
    demos = _demos("sft.family_noise={quote_ratio: 0.0}")
    ratio = [d for d in demos if _family(d) == "quote-ratio"]
    assert ratio
    assert all(d.messages == mcprl_tasks.ideal_demo(by_id[d.task_id]) for d in ratio)
    assert not all(d.succeeds for d in demos if _family(d) != "quote-ratio")  # the others stay imperfect


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["sft.family_weights={quote_ratoi: 2}"], "sft.family_weights / sft.family_noise: .*'quote_ratoi'"),
        (["sft.family_noise={relai: 0.0}"], "teacher noise names 'relai'"),
        (["sft.family_noise={quote_ratio: 1.5}"], "sft.family_noise: must be <= 1.0: 1.5"),
        (["sft.family_weights={quote_ratio: -1}"], "sft.family_weights: must be >= 0.0: -1.0"),
        (
            ["sft.family_weights={quote_ratio: 2}", "sft.demos=800", "tasks.train=VALIDATION"],
            "'quote_ratio': 320 asked, 200 tasks",
        ),
    ],
)
def test_a_mix_the_training_set_cannot_give_is_refused(overrides: list[str], message: str) -> None:
    import mcprl_tasks

    validation = str(mcprl_tasks.load_preset("demo")[1])
    with pytest.raises(ConfigError, match=message):
        _demos(*(o.replace("VALIDATION", validation) for o in overrides))
