"""ZeRO-3's partitioned KL reference on one CUDA device in bf16 (the a100x2 profile's precision), against the
full copy. The two-rank CPU tests (packages/mcprl-train/tests/test_ds_reference.py) cover partitioning across
ranks in fp32; this covers what only CUDA shows: the reference built under ``zero.Init`` in the engine's bf16 on
the device, its forward through DeepSpeed's CUDA path, and the EMA on bf16 partitions.
"""

from __future__ import annotations

import pytest
import torch

from mcprl_train.config import Config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs a CUDA device (scripts/test-gpu.sh runs these on one)"
    ),
]


@pytest.mark.usefixtures("one_process_group")
def test_the_partitioned_reference_matches_the_full_copy_in_bf16_on_cuda() -> None:
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (the deepspeed extra)")
    import deepspeed  # pyright: ignore[reportMissingTypeStubs]

    from mcprl_policy import ReferencePolicy
    from mcprl_train.loop.samples import Sample, micro_batch
    from mcprl_train.parallel.deepspeed import init_distributed
    from mcprl_train.parallel.ds_backend import deepspeed_backend

    config = Config.load(
        "a100x2",
        overrides=["model.name=tiny", "model.device=cuda", "distributed.num_gpus=1", "optim.lr=1e-2"],
    )
    assert (config.distributed.zero_stage, config.distributed.bf16) == (3, True)
    assert init_distributed() == (0, 1)
    backend = deepspeed_backend(config)
    part = backend.partitioned_reference()
    assert part is not None
    backend.publish()
    full = ReferencePolicy.for_policy(backend.sampling_policy)
    part.sync()
    full.sync()
    assert {p.dtype for p in part.model.parameters()} == {torch.bfloat16}
    assert part.partition_numel() == part.full_numel()  # a world of one holds the whole reference
    ids = [[1, 5, 9, 14, 3, 7, 11, 2, 8, 4], [6, 2, 9, 3]]
    theirs = full.logprobs(ids).logprobs
    ours = part.logprobs(ids).logprobs
    assert ours.device.type == "cuda"
    # The same bf16 weights through the same kernels; the gathered weights are views into one flat buffer,
    # which may pick another kernel path than the copy's own tensors: bf16's resolution near the logprobs.
    assert float((ours - theirs).abs().max()) <= 0.05
    sample = Sample(
        token_ids=torch.tensor(ids[0]),
        action_mask=torch.ones(len(ids[0]), dtype=torch.bool),
        old_logprobs=torch.zeros(len(ids[0])),
        advantages=torch.ones(len(ids[0])),
    )
    batches, _ = backend.lay_out([[sample]])
    m = micro_batch(batches[0], device=backend.policy.device)
    backend.zero_grad()
    out = backend.forward(m.ids, temperature=1.0, values=False)
    backend.backward(-(out.logprobs * m.mask).sum())
    backend.step()
    backend.publish()  # the full copy reads the engine's gathered weights; the partitioned one its partitions
    full.update(ema=0.5)
    part.update(ema=0.5)
    assert full.frozen is not None
    expected = full.frozen.state_dict()
    for name, p in part.model.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            assert torch.equal(p.detach(), expected[name]), name
