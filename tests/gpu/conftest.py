"""Fixtures of the GPU tests (``scripts/test-gpu.sh`` runs them on a CUDA machine; they skip elsewhere)."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture
def one_process_group() -> Iterator[None]:
    """A world of one (what torchrun would set for one GPU), torn down afterwards.

    vLLM's shutdown and DeepSpeed's init both use the default process group: whatever is left of it goes too.
    """
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        "WORLD_SIZE": "1",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
