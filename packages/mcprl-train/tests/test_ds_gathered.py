"""Sampling from a real DeepSpeed engine (one gloo rank on CPU, the tiny model): ZeRO-3 gathered, ZeRO-2 as is.

The engine runs in a subprocess (a process group of its own, as `mcprl-train` ranks have) that prints what it
observed; the test asserts on it. Two ranks end to end, against a sampling replica: test_ds_trainer.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.slow

_SCRIPT = """
import json, torch
from mcprl_train.build import build_policy
from mcprl_train.config import Config
from mcprl_train.loop.samples import Sample
from mcprl_train.parallel.deepspeed import init_distributed
from mcprl_train.parallel.ds_backend import deepspeed_backend

init_distributed()
ids = [1, 5, 9, 14, 3, 7, 11, 2]


def config(stage):
    return Config.load(profile="a100x2", overrides=[
        "model.name=tiny", "model.device=cpu", "model.dtype=float32", "model.gradient_checkpointing=false",
        "distributed.bf16=false", "distributed.num_gpus=1", f"distributed.zero_stage={stage}",
        "grpo.tasks_per_step=1", "optim.lr=1e-2", "optim.warmup_steps=0",
    ])


def logits(model):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids])).logits


def full(backend):
    return all(p.numel() == getattr(p, "ds_numel", p.numel()) for p in backend.module.parameters())


def update(backend):
    sample = Sample(
        token_ids=torch.tensor(ids), action_mask=torch.ones(len(ids), dtype=torch.bool),
        old_logprobs=torch.zeros(len(ids)), advantages=torch.ones(len(ids)),
    )
    backend.lay_out([[sample]])
    observed = {"full_in_update": full(backend)}
    if backend.gathered is not None:
        observed["hooks_in_update"] = len(backend.engine.optimizer.parameter_offload.forward_hooks) > 0
    backend.zero_grad()
    out = backend.forward([ids], temperature=1.0, values=False)
    backend.backward(-out.logprobs.sum())
    backend.step()
    return observed


report = {}
fresh = logits(build_policy(config(3)).model)
backend = deepspeed_backend(config(3))
offload = backend.engine.optimizer.parameter_offload
first = logits(backend.sampling_policy.model)
report["z3"] = {
    "samples_from_engine": backend.sampling_policy is backend.policy,
    "full_at_start": full(backend),
    "hooks_while_full": len(offload.forward_hooks),
    "same_logits_as_a_fresh_model": bool(torch.equal(first, fresh)),
    "full_after_a_sampler_call": full(backend),
    **update(backend),
    "full_after_step": full(backend),
}
backend.publish()
second = logits(backend.sampling_policy.model)
report["z3"]["moved"] = not torch.equal(first, second)
report["z3"]["full_after_publish"] = full(backend)
replica = deepspeed_backend(config(3).replace(["distributed.sampling=replica"]))
update(replica)
replica.publish()
report["z3"]["replica_full_engine"] = full(replica)

backend = deepspeed_backend(config(2))
before = logits(backend.sampling_policy.model)
update(backend)
backend.publish()
report["z2"] = {
    "samples_from_engine": backend.sampling_policy is backend.policy,
    "gathered": backend.gathered is not None,
    "live_weights": not torch.equal(before, logits(backend.sampling_policy.model)),
}
print("REPORT " + json.dumps(report) + "\\n", end="", flush=True)  # one write: two ranks share the pipe
"""


@pytest.fixture(scope="module")
def report() -> dict[str, Any]:
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "LOCAL_RANK": "0"}
    env |= {"WORLD_SIZE": "1", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, "-c", _SCRIPT], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("REPORT "))
    return json.loads(line.removeprefix("REPORT "))


def test_zero3_samplers_read_the_engines_gathered_weights_without_its_hooks(report: dict[str, Any]) -> None:
    z3 = report["z3"]
    assert z3["samples_from_engine"]
    assert z3["full_at_start"]
    assert z3["hooks_while_full"] == 0
    assert z3["same_logits_as_a_fresh_model"]
    assert z3["full_after_a_sampler_call"]  # no ZeRO-3 post-hook partitioned a layer behind the sampler


def test_zero3_weights_are_partitioned_during_the_update_and_follow_it(report: dict[str, Any]) -> None:
    z3 = report["z3"]
    assert not z3["full_in_update"]
    assert z3["hooks_in_update"]
    assert not z3["full_after_step"]  # the partitioned reference follows the engine's partitions: no gather
    assert z3["full_after_publish"]
    assert z3["moved"]
    assert not z3["replica_full_engine"]  # with a replica the engine stays partitioned


def test_zero2_samplers_read_the_engines_live_weights(report: dict[str, Any]) -> None:
    z2 = report["z2"]
    assert z2["samples_from_engine"]
    assert not z2["gathered"]
    assert z2["live_weights"]
