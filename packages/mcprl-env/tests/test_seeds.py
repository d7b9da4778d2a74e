"""Per-request sampling seeds: a hash of (collection seed, episode id, turn), handed to every sample call."""

from __future__ import annotations

import itertools

import pytest
from env_testkit import call, make_task

from mcprl_env import Environment, derive_seed, turn_seed
from mcprl_env.seeds import SEED_BITS
from mcprl_env.testing import CharTokenizer, ScriptedSampler
from mcprl_tools import ToolManager


def test_a_derived_seed_is_a_stable_63_bit_hash_of_its_parts() -> None:
    seed = derive_seed(3, "collect", 12)
    assert seed == derive_seed(3, "collect", 12)
    assert 0 <= seed < 2**SEED_BITS
    assert seed != derive_seed(3, "collect", 13)
    assert derive_seed(1, 2) != derive_seed(2, 1)  # order matters: not a sum
    assert derive_seed("12") != derive_seed(12)  # a str and an int never alias
    assert derive_seed("a", "bc") != derive_seed("ab", "c")  # parts are delimited


def test_nearby_inputs_give_unrelated_seeds() -> None:
    """An additive mix (seed * K + turn) puts consecutive turns at a fixed distance; a hash does not."""
    seeds = [turn_seed(7, "step-1/task/0", t) for t in range(64)]
    assert len(set(seeds)) == 64
    gaps = {b - a for a, b in itertools.pairwise(seeds)}
    assert len(gaps) == 63
    high_bits = {s >> (SEED_BITS - 8) for s in seeds}
    assert len(high_bits) > 30  # spread over the whole range, not clustered


@pytest.mark.parametrize("part", [True, 1.5, None, b"x"])
def test_a_part_that_is_not_an_int_or_str_is_refused(part: object) -> None:
    with pytest.raises(TypeError, match="seed parts must be int or str"):
        derive_seed(1, part)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_every_turn_is_sampled_with_the_seed_of_its_episode_and_turn(manager: ToolManager) -> None:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok)
    sampler = ScriptedSampler(tok, [call("multiply", a=3, b=4.5), "13.5"])
    groups = await env.run_groups([make_task()], sampler, group_size=3, namespace="step-4", seed=99)
    assert all(ep.stop_reason == "answer" for ep in groups[0].episodes)
    expected = [turn_seed(99, f"step-4/mul-1/{i}", t) for i in range(3) for t in range(2)]
    assert sorted(s for s in sampler.seeds if s is not None) == sorted(expected)
    assert len(sampler.seeds) == len(expected)


@pytest.mark.anyio
async def test_without_a_seed_the_sampler_keeps_its_own_randomness(manager: ToolManager) -> None:
    tok = CharTokenizer()
    env = Environment(manager=manager, tokenizer=tok)
    sampler = ScriptedSampler(tok, [call("multiply", a=3, b=4.5), "13.5"])
    await env.run_group(make_task(), sampler, group_size=2)
    assert sampler.seeds == [None] * 4
