"""The parts of the DeepSpeed learner that need no process group: filler sequences and logits-chunk counts."""

from __future__ import annotations

import pytest

from mcprl_train import collectives
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError
from mcprl_train.loop.samples import Sample
from mcprl_train.parallel.ds_backend import filler_sample, logit_chunks, pad_to_chunks
from mcprl_train.typed_torch import tensor_list


def sample(n: int) -> Sample:
    return filler_sample(n, 7)


def test_logit_chunks_count_prediction_rows_not_tokens() -> None:
    assert logit_chunks([5], 4) == 1  # 4 rows
    assert logit_chunks([6], 4) == 2  # 5 rows
    assert logit_chunks([3, 3, 3], 4) == 2  # 6 rows


@pytest.mark.parametrize("target", [1, 2, 3, 5])
def test_padding_reaches_exactly_the_target_chunk_count(target: int) -> None:
    samples = [sample(3), sample(4)]
    padded = pad_to_chunks(samples, target, 4, 0)
    assert logit_chunks([int(s.token_ids.numel()) for s in padded], 4) == max(target, 2)
    assert all(a is b for a, b in zip(padded, samples, strict=False))
    assert len(padded) == len(samples) + (target > 2)


def test_fillers_train_on_nothing() -> None:
    filler = filler_sample(5, 3)
    assert tensor_list(filler.token_ids, int) == [3] * 5
    assert not bool(filler.action_mask.any())
    assert float(filler.advantages.abs().sum()) == 0.0


def test_collectives_are_the_identity_in_one_process() -> None:
    assert collectives.world_size() == 1
    assert collectives.broadcast_object({"a": 1}) == {"a": 1}
    assert collectives.all_gather_objects(3) == [3]
    assert collectives.all_reduce_scalar(2.5, "max") == 2.5
    assert collectives.mean_metrics({"x": 1.0}, maxed=("x",)) == {"x": 1.0}


def test_sampling_is_the_engine_unless_a_replica_is_asked_for() -> None:
    assert Config.load(profile="a100x2").distributed.sampling == "engine"
    replica = Config.load(profile="a100x2", overrides=["distributed.sampling=replica"])
    assert replica.distributed.sampling == "replica"
    with pytest.raises(
        ConfigError, match=r"distributed\.sampling: got 'copy'; expected one of 'engine', 'replica'"
    ):
        Config.load(profile="a100x2", overrides=["distributed.sampling=copy"])


def test_overlap_under_deepspeed_says_it_would_need_a_replica() -> None:
    with pytest.raises(ConfigError, match=r"distributed\.sampling=replica"):
        Config.load(profile="a100x2", overrides=["collection.overlap=true"])
