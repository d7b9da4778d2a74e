"""Rollout/learn overlap (``collection.overlap``): step k+1 collected beside step k's update, one step behind.

The runs use the demo's real stdio MCP servers (finance, calculator, messaging) and the embedded tiny model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
import torch
from run_compare import is_timing
from train_testkit import demo_tasks, tiny_demo_run

from mcprl_policy import Policy
from mcprl_policy.threads import take_threads
from mcprl_train.config import Config
from mcprl_train.errors import ConfigError, InvalidRateError
from mcprl_train.loop.overlap import CollectedStep, learn_while_collecting
from mcprl_train.loop.snapshot import SamplingSnapshot
from mcprl_train.loop.trainer import Trainer
from mcprl_train.run.run_dir import RunDir


def overlapped(tmp_path: Path, name: str, tasks: Path, *extra: str) -> Config:
    return Config.load(
        "cpu",
        overrides=[
            *tiny_demo_run(tmp_path / "runs", name, tasks, steps=4),
            "run.checkpoint_every=0",
            "grpo.filter_zero_std=true",
            "grpo.backfill_rounds=1",
            "grpo.entropy_coef=0.05",  # every update moves the weights, even when every group ties
            "collection.overlap=true",
            "eval.every=2",
            "eval.n_tasks=6",
            "optim.lr=1e-2",
            *extra,
        ],
    )


# -- config ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "names"),
    [
        (["grpo.minibatches=2"], "grpo.minibatches=2"),
        (["grpo.old_logprobs=recompute"], "grpo.old_logprobs=recompute"),
        (["grpo.ppo_epochs=2"], "grpo.ppo_epochs=2"),
    ],
)
def test_overlap_with_a_recomputed_old_policy_and_no_tis_is_refused(settings: list[str], names: str) -> None:
    with pytest.raises(ConfigError, match=r"collection\.overlap.*set grpo\.tis") as caught:
        Config.load("cpu", overrides=["collection.overlap=true", *settings])
    assert names in str(caught.value)


def test_overlap_with_tis_weighs_the_recomputed_old_policy_against_the_sampler_and_is_accepted() -> None:
    config = Config.load("cpu", overrides=["collection.overlap=true", "grpo.minibatches=2", "grpo.tis=2.0"])
    assert config.collection.overlap


def test_overlap_under_deepspeed_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"collection\.overlap: true with distributed\.backend=deepspeed"):
        Config.load("cpu", overrides=["collection.overlap=true", "distributed.backend=deepspeed"])


def test_overlap_is_off_by_default_and_on_in_the_cpu_profile() -> None:
    assert not Config.from_dict({}).collection.overlap
    assert Config.load("cpu").collection.overlap


# -- the snapshot --------------------------------------------------------------------------------------------


def test_the_snapshot_keeps_its_weights_through_an_update_until_refreshed() -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    snapshot = SamplingSnapshot(policy)
    before = [p.detach().clone() for p in snapshot.policy.trainable_parameters()]
    with torch.no_grad():
        for p in policy.trainable_parameters():
            p.add_(0.5)
    after_update = snapshot.policy.trainable_parameters()
    assert all(torch.equal(a, b) for a, b in zip(after_update, before, strict=True))
    snapshot.refresh()
    live = policy.trainable_parameters()
    assert all(torch.equal(a, b) for a, b in zip(snapshot.policy.trainable_parameters(), live, strict=True))
    assert all(
        a.data_ptr() != b.data_ptr()
        for a, b in zip(snapshot.policy.trainable_parameters(), live, strict=True)
    )


def test_the_snapshot_shares_frozen_weights_instead_of_copying_them() -> None:
    policy = Policy.from_pretrained("tiny", value_head=False)
    frozen = dict(policy.model.named_parameters())["model.embed_tokens.weight"]
    frozen.requires_grad_(False)
    snapshot = SamplingSnapshot(policy)
    mine = dict(snapshot.policy.model.named_parameters())
    assert mine["model.embed_tokens.weight"] is frozen
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable
    assert all(mine[n] is not dict(policy.model.named_parameters())[n] for n in trainable)


# -- running an update beside a collection -----------------------------------------------------------------


def test_the_update_runs_in_a_thread_while_the_collection_runs_on_the_event_loop() -> None:
    """Each side waits until the other has started: run one after the other, this would fail or time out."""
    sentinel = object()

    async def main() -> tuple[dict[str, float], CollectedStep | None]:
        learning, collecting = anyio.Event(), anyio.Event()

        def learn() -> dict[str, float]:
            anyio.from_thread.run_sync(learning.set)
            anyio.from_thread.run(collecting.wait)
            return {"loss/policy": 1.0}

        async def collect() -> CollectedStep:
            collecting.set()
            await learning.wait()
            return sentinel  # type: ignore[return-value]

        with anyio.fail_after(20):
            return await learn_while_collecting(learn, collect)

    learned, ready = anyio.run(main)
    assert ready is sentinel
    assert learned["loss/policy"] == 1.0
    assert learned["perf/learn_s"] >= 0.0


def test_the_update_and_the_collection_share_torch_threads_and_the_update_alone_takes_them_all() -> None:
    """Beside a collection, the update's thread and the collection's worker threads run on half the count each."""
    seen: dict[str, int] = {}
    sentinel = object()

    def threads(side: str) -> None:
        take_threads()  # what the decode engine's worker thread does before its forwards
        seen[side] = torch.get_num_threads()

    def learn(side: str) -> dict[str, float]:
        threads(side)
        return {}

    async def collect() -> CollectedStep:
        await anyio.to_thread.run_sync(threads, "engine")
        return sentinel  # type: ignore[return-value]

    async def main() -> None:
        await learn_while_collecting(lambda: learn("update"), collect)
        await learn_while_collecting(lambda: learn("update alone"), None)

    before = torch.get_num_threads()
    torch.set_num_threads(4)  # more than this machine's cores is allowed; the split halves it
    try:
        anyio.run(main)
    finally:
        torch.set_num_threads(before)
    assert seen == {"update": 2, "engine": 2, "update alone": 4}


def test_a_collection_error_reaches_the_caller_as_itself_after_the_update_finished() -> None:
    """The invalid-rate guard in a collection beside an update stops the run with its own error, not a group."""
    finished: list[bool] = []

    def learn() -> dict[str, float]:
        anyio.from_thread.run(anyio.sleep, 0.2)
        finished.append(True)
        return {}

    async def collect() -> CollectedStep:
        raise InvalidRateError(
            "8/8 episodes (100.0%) failed for reasons other than the model, above run.max_invalid_rate"
        )

    async def main() -> None:
        await learn_while_collecting(learn, collect)

    with pytest.raises(InvalidRateError, match="max_invalid_rate"):
        anyio.run(main)
    assert finished == [True]


def test_an_update_error_reaches_the_caller_as_itself() -> None:
    def learn() -> dict[str, float]:
        raise FloatingPointError("loss is nan")

    async def collect() -> CollectedStep:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async def main() -> None:
        with anyio.fail_after(20):
            await learn_while_collecting(learn, collect)

    with pytest.raises(FloatingPointError, match="loss is nan"):
        anyio.run(main)


def test_without_a_collection_the_update_runs_alone() -> None:
    async def main() -> tuple[dict[str, float], CollectedStep | None]:
        return await learn_while_collecting(lambda: {"loss/policy": 2.0}, None)

    learned, ready = anyio.run(main)
    assert ready is None
    assert learned["loss/policy"] == 2.0


# -- real runs -------------------------------------------------------------------------------------------------


class Weights:
    """Hook: the trained weights after each GRPO step (step 0: before the first), and the samplers' in sync."""

    def __init__(self) -> None:
        self.after: dict[int, list[torch.Tensor]] = {}
        self.in_sync: dict[int, bool] = {}

    def __call__(self, event: str, trainer: Trainer) -> None:
        step = trainer.state.step
        if event == "before_rollout" and step == 0 and trainer.state.stage == "grpo":
            self.after[0] = [p.detach().clone() for p in trainer.policy.trainable_parameters()]
        if event == "after_step":
            live = trainer.policy.trainable_parameters()
            self.after[step] = [p.detach().clone() for p in live]
            sampling = trainer.rollouts.sampling_policy.trainable_parameters() if trainer.rollouts else []
            self.in_sync[step] = sampling is not live and all(
                torch.equal(a, b) for a, b in zip(sampling, live, strict=True)
            )


def grpo_records(run: Path) -> dict[int, dict[str, Any]]:
    return {r["step"]: r for r in RunDir.open(run).read_metrics().records if r["kind"] == "grpo"}


def sampled_logprob_gap(trainer: Trainer, weights: list[torch.Tensor], episode: dict[str, Any]) -> float:
    """Largest |logprob under ``weights`` − the sampler's logprob| over the episode's sampled tokens."""
    assert trainer.backend is not None
    with torch.no_grad():
        for p, w in zip(trainer.policy.trainable_parameters(), weights, strict=True):
            p.copy_(w)
        out = trainer.backend.forward([episode["token_ids"]], temperature=1.0, values=False)
    mask = torch.tensor(episode["loss_mask"], dtype=torch.bool)
    sampled = torch.tensor(episode["sampler_logprobs"], dtype=out.logprobs.dtype)
    return float((out.logprobs[mask] - sampled[mask]).abs().max())


@pytest.mark.slow
def test_an_overlapped_run_samples_each_step_from_the_weights_one_update_behind(tmp_path: Path) -> None:
    tasks = demo_tasks(tmp_path / "tasks.json", 2)
    config = overlapped(tmp_path, "overlap", tasks)
    weights = Weights()
    trainer = Trainer(config, RunDir.create(config), hooks=(weights,))
    summary = trainer.run()
    run = tmp_path / "runs" / "overlap"

    assert summary["steps"] == 4
    records = grpo_records(run)
    assert [records[s]["rollout/policy_lag"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 1.0, 1.0]
    assert all(weights.in_sync[s] for s in (1, 2, 3, 4))
    assert not all(torch.equal(a, b) for a, b in zip(weights.after[4], weights.after[0], strict=True))
    evals = [r["tag"] for r in RunDir.open(run).read_metrics().records if r["kind"] == "eval"]
    assert evals == ["warm_start", "periodic", "final"]
    assert (run / "summary.json").is_file()
    assert RunDir.open(run).checkpoints.load_latest() is not None

    # The tokens of step 3 were sampled by the weights after update 1, not those after update 2.
    episodes = [r for r in RunDir.open(run).read_trajectories().records if r["step"] == 3 and r["valid"]]
    assert episodes
    episode = max(episodes, key=lambda r: sum(r["loss_mask"]))
    behind = sampled_logprob_gap(trainer, weights.after[1], episode)
    current = sampled_logprob_gap(trainer, weights.after[2], episode)
    assert behind < 1e-4, behind
    assert current > 100 * max(behind, 1e-6), (behind, current)


class Interrupted(Exception):
    """Raised by a hook right after a GRPO checkpoint (a crash at that point)."""


def stop_after_checkpoint(step: int) -> Any:
    def hook(event: str, trainer: Trainer) -> None:
        if event == "after_checkpoint" and trainer.state.stage == "grpo" and trainer.state.step == step:
            raise Interrupted

    return hook


def untimed(record: dict[str, Any]) -> dict[str, Any]:
    """The record without its clock readings (`run_compare.is_timing`) and its run's name."""
    return {k: v for k, v in record.items() if not (k.startswith("run") or is_timing(k))}


def episodes_after(run: Path, step: int) -> dict[tuple[int, str], dict[str, Any]]:
    return {
        (r["step"], r["episode_id"]): {
            **{k: v for k, v in r.items() if k != "run"},
            "metrics": untimed(r["metrics"]),
        }
        for r in RunDir.open(run).read_trajectories().records
        if r["step"] > step
    }


@pytest.mark.slow
def test_a_resumed_overlapped_run_equals_the_uninterrupted_overlapped_run(tmp_path: Path) -> None:
    """Checkpoint at step 2 (drained: nothing in flight); step 4 is collected beside step 3's update."""
    tasks = demo_tasks(tmp_path / "tasks.json", 2)
    extra = ("run.checkpoint_every=2", "eval.every=0")
    straight = overlapped(tmp_path, "straight", tasks, *extra)
    Trainer(straight, RunDir.create(straight)).run()
    cut = overlapped(tmp_path, "cut", tasks, *extra)
    with pytest.raises(Interrupted):
        Trainer(cut, RunDir.create(cut), hooks=(stop_after_checkpoint(2),)).run()
    Trainer(cut, RunDir.open(tmp_path / "runs" / "cut"), resume=True).run()

    a, b = grpo_records(tmp_path / "runs" / "straight"), grpo_records(tmp_path / "runs" / "cut")
    assert [a[s]["rollout/policy_lag"] for s in (1, 2, 3, 4)] == [0.0, 1.0, 0.0, 1.0]
    assert sorted(b) == [1, 2, 3, 4]
    for step in (3, 4):
        assert untimed(a[step]) == untimed(b[step]), step
    ea, eb = episodes_after(tmp_path / "runs" / "straight", 2), episodes_after(tmp_path / "runs" / "cut", 2)
    assert ea
    assert ea == eb
