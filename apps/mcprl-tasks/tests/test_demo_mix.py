from __future__ import annotations

import math
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcprl_tasks import PlannedDemo, family_quotas, plan_demos
from mcprl_tasks.errors import TasksError


def test_equal_weights_share_the_remainder_in_the_order_of_first_appearance() -> None:
    assert family_quotas({"a": 10, "b": 10, "c": 10}, 10, {}) == {"a": 4, "b": 3, "c": 3}
    assert family_quotas({"c": 10, "b": 10, "a": 10}, 10, {}) == {"c": 4, "b": 3, "a": 3}


def test_a_doubled_family_gets_twice_the_share_of_each_other() -> None:
    available = {"quote": 1000, "quote_mul": 1000, "quote_ratio": 1000, "post_quote": 1000}
    assert family_quotas(available, 800, {"quote_ratio": 2}) == {
        "quote": 160,
        "quote_mul": 160,
        "quote_ratio": 320,
        "post_quote": 160,
    }
    # exact shares 2.5 / 5 / 2.5: the first family listed gets the remaining one
    assert family_quotas({"a": 9, "b": 9, "c": 9}, 10, {"b": 2.0}) == {"a": 3, "b": 5, "c": 2}


def test_a_family_weighted_zero_gets_no_demonstration() -> None:
    assert family_quotas({"a": 5, "b": 5}, 4, {"a": 0}) == {"a": 0, "b": 4}


@given(
    weights=st.lists(st.floats(min_value=0.0, max_value=10.0), min_size=1, max_size=6).filter(
        lambda w: sum(w) > 0
    ),
    n=st.integers(min_value=0, max_value=200),
)
def test_quotas_sum_to_n_and_stay_within_one_of_the_exact_share(weights: list[float], n: int) -> None:
    named = {f"f{i}": w for i, w in enumerate(weights)}
    quotas = family_quotas(dict.fromkeys(named, n), n, named)
    assert sum(quotas.values()) == n
    for family, q in quotas.items():
        assert abs(q - n * named[family] / sum(weights)) < 1


@pytest.mark.parametrize(
    ("available", "n", "weights", "message"),
    [
        ({"a": 5}, 3, {"quote_ratio": 2}, "weights name 'quote_ratio', which no training task"),
        ({"a": 5}, 3, {"a": -1.0}, "weight of 'a' must be a finite number >= 0, got -1.0"),
        ({"a": 5}, 3, {"a": math.inf}, "must be a finite number"),
        ({"a": 5, "b": 5}, 3, {"a": 0, "b": 0}, "every family's demonstration weight is 0"),
        ({"a": 2, "b": 10}, 9, {"a": 5}, "more tasks than a family has \\('a': 8 asked, 2 tasks\\)"),
    ],
)
def test_impossible_mixes_are_refused_naming_the_family(
    available: dict[str, int], n: int, weights: dict[str, float], message: str
) -> None:
    with pytest.raises(TasksError, match=message):
        family_quotas(available, n, weights)


def test_without_weights_the_first_n_tasks_are_taken_as_they_come() -> None:
    families = ["a", "b", "a", "c", "a"]
    plan = plan_demos(families, 3, teacher_noise=0.25)
    assert plan == [PlannedDemo(0, 0.25), PlannedDemo(1, 0.25), PlannedDemo(2, 0.25)]
    assert [p.position for p in plan_demos(families, 99, teacher_noise=0.0)] == [0, 1, 2, 3, 4]


def test_weights_take_each_family_s_first_tasks_in_the_order_s_interleaving() -> None:
    rng = random.Random(0)
    families = [rng.choice("abcd") for _ in range(400)]
    plan = plan_demos(families, 100, teacher_noise=1.0, weights={"d": 2.0})
    positions = [p.position for p in plan]
    assert positions == sorted(positions)
    taken = Counter(families[i] for i in positions)
    assert taken == {"a": 20, "b": 20, "c": 20, "d": 40}
    for family in "abcd":
        first = [i for i, f in enumerate(families) if f == family][: taken[family]]
        assert [i for i in positions if families[i] == family] == first


def test_noise_by_family_overrides_the_default_for_that_family_only() -> None:
    families = ["a", "b", "a", "b"]
    plan = plan_demos(families, 4, teacher_noise=1.0, noise_by_family={"b": 0.0})
    assert [p.teacher_noise for p in plan] == [1.0, 0.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("noise", "default", "message"),
    [
        ({"z": 0.5}, 1.0, "teacher noise names 'z', which no training task"),
        ({"a": 1.5}, 1.0, "the teacher noise of 'a' must be in \\[0, 1\\], got 1.5"),
        ({}, -0.1, "the teacher noise must be in \\[0, 1\\], got -0.1"),
    ],
)
def test_bad_noise_is_refused(noise: dict[str, float], default: float, message: str) -> None:
    with pytest.raises(TasksError, match=message):
        plan_demos(["a", "b"], 2, teacher_noise=default, noise_by_family=noise)


def test_a_bundled_family_the_tasks_leave_out_is_skipped_and_an_unknown_one_is_refused() -> None:
    families = ["quote", "post_quote", "quote", "post_quote"]
    plain = plan_demos(families, 3, teacher_noise=1.0)
    moot = plan_demos(
        families, 3, teacher_noise=1.0, weights={"quote_ratio": 2.0}, noise_by_family={"quote_ratio": 0.0}
    )
    assert moot == plain
    with pytest.raises(TasksError, match="teacher noise names 'quote_ratoi', which no training task"):
        plan_demos(families, 3, teacher_noise=1.0, noise_by_family={"quote_ratoi": 0.0})
    with pytest.raises(TasksError, match="weights name 'quote_ratoi', which no training task"):
        plan_demos(families, 3, teacher_noise=1.0, weights={"quote_ratoi": 2.0})
