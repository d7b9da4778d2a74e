"""What `mcprl_train.build` makes from a config: here, the warm-start demonstrations."""

from __future__ import annotations

from mcprl_train.build import load_demos
from mcprl_train.config import Config


def _demos(*overrides: str) -> list[tuple[str, list[dict[str, str]], bool]]:
    config = Config.load("cpu", overrides=["sft.demos=60", "sft.teacher_noise=1.0", *overrides])
    return load_demos(config)


def _retries(messages: list[dict[str, str]]) -> int:
    return sum(m["role"] == "tool" and "Unknown symbol" in m["content"] for m in messages)


def test_teacher_typos_add_a_recovered_lookup_to_some_demonstrations() -> None:
    plain = _demos()
    typos = _demos("sft.teacher_typos=1.0")
    assert [d[0] for d in plain] == [d[0] for d in typos]  # the same tasks, in the same order
    assert sum(_retries(m) for _, m, _ in plain) == 0
    assert all(_retries(m) <= 1 for _, m, _ in typos)
    assert sum(_retries(m) for _, m, _ in typos) >= 30


def test_demonstrations_are_the_same_in_every_run() -> None:
    assert _demos("sft.teacher_typos=0.3") == _demos("sft.teacher_typos=0.3")
