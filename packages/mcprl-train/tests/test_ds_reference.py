"""The ZeRO-3 partitioned KL reference on two gloo ranks (CPU, the tiny model in fp32), against the full copy.

The engine and both references run in two torchrun workers that print what they observed; the tests assert
on it. The full-copy reference is `mcprl_policy.ReferencePolicy` of the engine's gathered weights, the path
every rank took before the reference was partitioned (and still takes under ZeRO 0-2). The end-to-end resume
runs ``mcprl-train --profile a100x2`` as test_ds_trainer.py does.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from ds_testkit import a100x2, learned, rank_records, trainer_overrides
from safetensors.torch import load_file  # pyright: ignore[reportUnknownVariableType]

from mcprl_train.run.run_dir import RunDir

pytestmark = pytest.mark.slow

_SCRIPT = r"""
import json, sys, tempfile, torch, deepspeed
from pathlib import Path
from mcprl_policy import ReferencePolicy
from mcprl_train.config import Config
from mcprl_train.errors import CheckpointError
from mcprl_train.loop.samples import Sample, micro_batch
from mcprl_train.parallel.deepspeed import init_distributed
from mcprl_train.parallel.ds_backend import deepspeed_backend

rank, world = init_distributed()
config = Config.load(profile="a100x2", overrides=[
    "model.name=tiny", "model.device=cpu", "model.dtype=float32", "model.gradient_checkpointing=false",
    "distributed.bf16=false", "grpo.tasks_per_step=2", "optim.lr=1e-2", "optim.warmup_steps=0",
    "optim.logits_chunk_size=16",
])
backend = deepspeed_backend(config)
part = backend.partitioned_reference()
full = ReferencePolicy.for_policy(backend.sampling_policy)  # a full copy of the engine's gathered weights
part.sync()
full.sync()
torch.manual_seed(rank)
lengths = [[9, 30], [7]][rank]  # rank 1 makes fewer logits chunks: lay_out tops its micro-batch up
samples = [
    Sample(token_ids=torch.randint(3, 150, (n,)), action_mask=torch.ones(n, dtype=torch.bool),
           old_logprobs=torch.zeros(n), advantages=torch.ones(n))
    for n in lengths
]
batches, fillers = backend.lay_out([samples])
micros = [micro_batch(b, device=backend.policy.device) for b in batches]


def logprob_diff():
    diffs = []
    for m in micros:
        ours = part.logprobs(m.ids).logprobs  # collective: both ranks, once per micro-batch
        backend.publish()  # the full copy's forward is local; the engine gathers for the update after
        theirs = full.logprobs(m.ids).logprobs
        diffs.append(float((ours - theirs).abs().max()))
    return max(diffs)


def gathered():
    out = {}
    for name, p in part.model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            out[name] = p.detach().clone()
    return out


def equal_to_full(state):
    reference = full.frozen.state_dict()
    return all(torch.equal(t, reference[n]) for n, t in state.items())


report = {
    "rank": rank,
    "fillers": fillers,
    "partition_numel": part.partition_numel(),
    "full_numel": part.full_numel(),
    "model_numel": sum(p.numel() for p in full.frozen.parameters()),
    "ceil_halves": sum(-(-p.numel() // world) for p in full.frozen.parameters()),
    "logprob_diff_start": logprob_diff(),
    "held_after_forward": sum(p.numel() for p in part.model.parameters()),
    "dtype": str(next(iter(part.model.parameters())).dtype),
}
start = gathered()
for step in range(3):
    m = micros[0]
    backend.zero_grad()
    out = backend.forward(m.ids, temperature=1.0, values=False)
    backend.backward(-(out.logprobs * m.mask).sum())
    backend.step()
    backend.publish()
    full.update(ema=0.5)
    part.update(ema=0.5)
after = gathered()
report["ema_equal"] = equal_to_full(after)
report["moved_from_start"] = any(not torch.equal(t, start[n]) for n, t in after.items())
report["logprob_diff_after_ema"] = logprob_diff()

saved = Path(sys.argv[1])
part.save_partition(saved)
part.sync()  # away from the saved partitions
report["sync_equals_engine"] = all(
    torch.equal(part_p.ds_tensor, eng_p.ds_tensor) for _, part_p, eng_p in part.pairs
)
try:
    part.load_state_dict({})
    report["empty_state_refused"] = False
except CheckpointError:
    report["empty_state_refused"] = True
part.load_partition(saved)
report["restored_from_partition"] = equal_to_full(gathered())
part.sync()
part.load_state_dict(full.state_dict())  # a full copy's checkpointed tensors, sliced to this rank
report["restored_from_full_tensors"] = equal_to_full(gathered())
print("REPORT " + json.dumps(report) + "\n", end="", flush=True)  # one write: two ranks share the pipe
"""


NATIVE_ABORT = "terminate called without an active exception"
"""What a rank prints when it aborts in C++ (SIGABRT) before the script's own code fails."""


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("ds-reference")
    script = tmp / "reference_ranks.py"
    script.write_text(_SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    env = {k: v for k, v in env.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]

    def launch() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, str(script), str(tmp / "partitions")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )

    proc = launch()
    if proc.returncode != 0 and NATIVE_ABORT in proc.stderr and "REPORT " not in proc.stdout:
        # Seen twice in full test runs (benchmarks/RESULTS.md, 2026-11-28), never in 6 reruns of this file alone:
        # a rank aborts in native code right after loading the model, before the reference's code runs. One
        # retry, said aloud; a second abort, or any other failure, fails the module.
        warnings.warn(f"a rank aborted before its report; retrying once: {proc.stderr[-1500:]}", stacklevel=1)
        proc = launch()
    assert proc.returncode == 0, proc.stderr[-6000:]
    found = [
        json.loads(x.removeprefix("REPORT ")) for x in proc.stdout.splitlines() if x.startswith("REPORT ")
    ]
    return sorted(found, key=lambda r: r["rank"])


# Both forwards read the same fp32 values in the same kernels; measured equal to the bit. The bound allows the
# alignment-dependent rounding test_ds_trainer.py measured for one-row products on gathered views (two fp32
# ulps near 8), should a kernel ever pick another path for an unaligned weight.
_LOGPROB_TOL = 2 * 2**-20


def test_partitioned_reference_logprobs_equal_the_full_copys(reports: list[dict[str, Any]]) -> None:
    assert [r["rank"] for r in reports] == [0, 1]
    assert reports[1]["fillers"] > 0  # the collective forward ran on topped-up micro-batches
    for r in reports:
        assert r["logprob_diff_start"] <= _LOGPROB_TOL
        assert r["logprob_diff_after_ema"] <= _LOGPROB_TOL
        assert r["dtype"] == "torch.float32"


def test_each_rank_holds_half_of_the_reference(reports: list[dict[str, Any]]) -> None:
    for r in reports:
        assert r["full_numel"] == r["model_numel"]
        assert r["partition_numel"] == r["ceil_halves"]
        assert r["partition_numel"] <= r["model_numel"] / 2 + 64
        assert r["held_after_forward"] == 0  # no parameter stays gathered after the reference forward


def test_ema_on_partitions_equals_the_full_copy_ema(reports: list[dict[str, Any]]) -> None:
    for r in reports:
        assert r["moved_from_start"]
        assert r["ema_equal"]  # bit for bit: the same elementwise ops on the same values


def test_partitions_restore_from_their_files_or_from_full_tensors(reports: list[dict[str, Any]]) -> None:
    for r in reports:
        assert r["sync_equals_engine"]
        assert r["empty_state_refused"]
        assert r["restored_from_partition"]
        assert r["restored_from_full_tensors"]


# -- end to end: a resumed two-rank a100x2 run equals the uninterrupted one ----------------------------------


def test_a_resumed_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    """Three steps straight through; then the same run cut back to its step-2 checkpoint and resumed."""
    overrides = [*trainer_overrides(tmp_path, "straight"), "run.steps=3", "eval.every=0"]
    first = a100x2("--profile", "a100x2", *[a for o in overrides for a in ("--set", o)])
    assert first.returncode == 0, first.stderr[-6000:]
    straight = tmp_path / "runs" / "straight"
    resumed = tmp_path / "runs" / "resumed"
    shutil.copytree(straight, resumed)
    for later in resumed.glob("checkpoints/step-00000003*"):
        shutil.rmtree(later)  # the latest pointer now names a missing checkpoint: step 2 is the newest left
    assert sorted(
        p.name for p in (resumed / "checkpoints/step-00000002/engine").glob("reference-rank-*.pt")
    ) == [
        "reference-rank-00000.pt",
        "reference-rank-00001.pt",
    ]
    proc = a100x2("--resume", str(resumed))
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "step-00000002" in json.loads((resumed / "summary.json").read_text())["resumed_from"]
    ours = [r for r in RunDir.open(resumed).read_metrics().records if r["kind"] == "grpo"]
    theirs = [r for r in RunDir.open(straight).read_metrics().records if r["kind"] == "grpo"]
    assert [r["step"] for r in ours] == [r["step"] for r in theirs] == [1, 2, 3]
    assert all("loss/kl" in r and math.isfinite(r["loss/kl"]) for r in ours)
    assert theirs[2]["loss/kl"] > 0.0  # the reference moved away from the policy and the KL term saw it
    assert [learned(r) for r in ours] == [learned(r) for r in theirs]
    weights = "checkpoints/step-00000003*/policy/model.safetensors"
    final = [load_file(p) for p in (sorted(straight.glob(weights))[-1], sorted(resumed.glob(weights))[-1])]
    assert all(torch.equal(v, final[1][k]) for k, v in final[0].items())
    assert {r["digest"] for r in [*rank_records(straight), *rank_records(resumed)]} == {
        rank_records(straight)[0]["digest"]
    }
