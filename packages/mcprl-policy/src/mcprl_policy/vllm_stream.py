"""Continuous batching over a vLLM engine: each request joins the running batch at the next engine step.

A sampler's ``sample`` call queues its request here and waits. Whichever caller finds nobody driving becomes
the driver (`mcprl_policy.batcher.Batcher`): between engine steps, in the event loop, it adds every queued
request to the engine (``LLMEngine.add_request``) and withdraws abandoned ones, then runs one scheduler step
(``LLMEngine.step``: one forward over every running request, prefill chunks and decode tokens together) in a
worker thread, and wakes the callers whose requests finished. So a turn that arrives while others generate
starts at the next step, not after them; a finished request leaves at once. When the driver's own request is
done it hands the role to a caller whose request is still running or queued. vLLM's ``AsyncLLM`` does the same
with a background output task and, in 0.32, always an engine-core process; this loop keeps the engine core in
this process (the full-weight reload needs it) and runs only while some caller awaits it.

Weights: requests are added only when the engine holds the policy's current weights; when they changed, the
running requests finish first, then the engine syncs (`Engine.sync`), so no request mixes two weight versions.

All samplers sharing an engine share its stream (one scheduler, one step loop).
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import anyio
import attrs
import structlog

from mcprl_policy.batcher import Batcher, Wakeup
from mcprl_policy.errors import SamplerError
from mcprl_policy.policy import Policy
from mcprl_policy.vllm_engine import Engine, require_vllm

__all__ = ["Generated", "RequestStream"]

_log = structlog.get_logger()


@attrs.define(eq=False, kw_only=True)
class _Request:
    request_id: str
    prompt_ids: list[int]
    params: Any
    policy: Policy
    wake: Wakeup = attrs.field(factory=Wakeup)
    output: Any = None
    error: BaseException | None = None
    queued_at: float = attrs.field(factory=time.monotonic)
    admitted_at: float | None = None

    @property
    def finished(self) -> bool:
        return self.output is not None or self.error is not None


@attrs.frozen(kw_only=True)
class Generated:
    """A finished request.

    Attributes:
        output: vLLM's final ``RequestOutput``.
        queue_s: seconds from `RequestStream.generate` until the request was added to the engine (the wait for
            a fuller first batch, for the driver's next turn between steps, for the running requests to finish
            before a weight sync). vLLM's own scheduler may keep an added request waiting too, when
            ``max_num_seqs`` requests run or the KV cache is full; that wait is not measured here (its
            per-request timestamps need vLLM's stats logging), so it counts as the request's service.
    """

    output: Any
    queue_s: float


class RequestStream:
    """The request queue and step loop of one engine.

    Args:
        engine: the engine requests run on.
        max_batch_size: queued requests that start an idle engine at once, without waiting out ``max_wait_ms``
            (vLLM's ``max_num_seqs`` bounds how many run per step).
        max_wait_ms: how long an idle engine waits for more requests before its first step (a GRPO group's
            requests then share their first prefill); 0 starts at once. A busy engine never waits.
    """

    def __init__(self, engine: Engine, *, max_batch_size: int, max_wait_ms: float) -> None:
        # Weak: the engine holds its stream, and an engine left to the cycle collector would shut down (tearing
        # down vLLM's process-global parallel state) at a random later time, under the next in-process engine.
        self._engine = weakref.ref(engine)
        self._tokens_prompt = require_vllm().TokensPrompt
        self._batcher = Batcher(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        self._queued: list[_Request] = []
        self._running: dict[str, _Request] = {}
        self._abandoned: list[str] = []
        self._news = threading.Event()  # set from the event loop when the step thread should come back
        self._ids = itertools.count()
        self.steps = 0
        self.requests = 0
        self.running_max = 0

    @property
    def engine(self) -> Engine:
        """The engine this stream feeds."""
        engine = self._engine()
        if engine is None or engine.closed:
            raise SamplerError("the vLLM engine of this request stream was closed")
        return engine

    @property
    def busy(self) -> bool:
        """Whether requests are queued or running (weights must not change now)."""
        return bool(self._queued or self._running)

    async def generate(self, prompt_ids: Sequence[int], params: Any, *, policy: Policy) -> Generated:
        """Run one request to completion; returns vLLM's final ``RequestOutput`` and its wait (`Generated`).

        Args:
            prompt_ids: the prompt's token ids.
            params: its ``vllm.SamplingParams`` (``output_kind`` FINAL_ONLY).
            policy: whose weights the engine must hold when the request starts.

        Raises:
            SamplerError: vLLM refused the request or a step failed.
        """
        request = _Request(
            request_id=f"mcprl-{next(self._ids)}", prompt_ids=list(prompt_ids), params=params, policy=policy
        )
        self._queued.append(request)
        self._news.set()
        self._batcher.queued(len(self._queued))
        await self._batcher.serve(
            request.wake,
            finished=lambda: request.finished,
            drive=lambda: self._drive(request),
            hand_off=self._hand_off,
            abandon=lambda: self._abandon(request),
        )
        if request.error is not None:
            raise SamplerError(f"vLLM generation failed: {request.error!r}") from request.error
        admitted = request.admitted_at if request.admitted_at is not None else request.queued_at
        return Generated(output=request.output, queue_s=admitted - request.queued_at)

    def metrics(self) -> dict[str, float]:
        """``sampler/engine_steps``, ``sampler/requests``, ``sampler/running_max`` (most requests in one step)."""
        return {
            "sampler/engine_steps": float(self.steps),
            "sampler/requests": float(self.requests),
            "sampler/running_max": float(self.running_max),
        }

    async def _drive(self, request: _Request) -> None:
        await self._batcher.gather(len(self._queued), busy=bool(self._running))
        while not request.finished:
            self._withdraw_abandoned()
            self._admit()
            if not self._running:
                return  # every queued request was refused (its error set) or waits for nothing
            self.running_max = max(self.running_max, len(self._running))
            self._news.clear()
            try:
                finished = await anyio.to_thread.run_sync(self._steps)
            except Exception as exc:
                self._fail_running(exc)
                return
            for out in finished:
                done = self._running.pop(out.request_id, None)
                if done is not None:
                    done.output = out
                    done.wake.set()

    def _admit(self) -> None:
        """Add the queued requests to the engine, syncing its weights first when it is idle and they changed."""
        if not self._queued:
            return
        policy = self._queued[0].policy
        if not self.engine.holds(policy):
            if self._running:
                return  # the running requests finish on the weights they started with
            self.engine.sync(policy, force=False)
        queued, self._queued = self._queued, []
        core = self.engine.core
        for r in queued:
            r.admitted_at = time.monotonic()
            try:
                with self.engine.lock:
                    core.add_request(
                        r.request_id,
                        self._tokens_prompt(prompt_token_ids=r.prompt_ids),
                        r.params,
                        lora_request=self.engine.lora_request,
                    )
            except Exception as exc:  # a request vLLM refuses (too long, bad params) fails alone
                r.error = exc
                r.wake.set()
                continue
            self._running[r.request_id] = r
            self.requests += 1

    def _steps(self) -> list[Any]:
        """Step the engine until a request finishes, a caller queues or abandons one, or nothing runs."""
        core = self.engine.core
        while True:
            with self.engine.lock:
                finished = [out for out in core.step() if out.finished]
                self.steps += 1
                if finished or self._news.is_set() or not core.has_unfinished_requests():
                    return finished

    def _fail_running(self, exc: BaseException) -> None:
        _log.error("vllm_step_failed", error=repr(exc), running=len(self._running))
        for r in self._running.values():
            r.error = exc
            r.wake.set()
        self._abandoned.extend(self._running)
        self._running.clear()

    def _abandon(self, request: _Request) -> None:
        """A caller left early: drop its request from the queue, or abort it in the engine."""
        if request in self._queued:
            self._queued.remove(request)
        elif self._running.pop(request.request_id, None) is not None:
            self._abandoned.append(request.request_id)
            self._news.set()
            if not self._batcher.driving:
                self._withdraw_abandoned()

    def _withdraw_abandoned(self) -> None:
        if self._abandoned:
            ids, self._abandoned = self._abandoned, []
            with self.engine.lock:
                self.engine.core.abort_request(ids)

    def _hand_off(self) -> None:
        """Wake a caller whose request is still queued or running, to drive the next steps."""
        waiting = self._queued[0] if self._queued else next(iter(self._running.values()), None)
        if waiting is not None:
            waiting.wake.set()
