"""The transformers sampler: concurrent requests from many episodes share batched KV-cache decoding.

Requests queue up in the engine; a `Batcher` elects a *driver* among the callers: it waits a bounded time for
more requests (``max_wait_ms``, or until ``max_batch_size`` are waiting; not while a batch is running), then
runs the `DecodeEngine` in a worker thread. The engine returns each time a request finishes; the driver hands
the results out and keeps going until its own request is done, then passes the role to a caller whose
request is still running or waiting. New requests join the running batch between decode steps (continuous
batching). No background task or thread outlives the callers: the engine only runs while some caller awaits
it.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
import structlog

from mcprl_policy.batcher import Batcher, Wakeup
from mcprl_policy.completion import Completion
from mcprl_policy.config import DecodeForward, SamplingParams
from mcprl_policy.decode import DecodeEngine, DecodeRequest
from mcprl_policy.errors import SamplerError
from mcprl_policy.policy import Policy
from mcprl_policy.threads import take_threads
from mcprl_policy.vocab import embedding_rows, end_of_turn_ids

__all__ = ["HFSampler"]

_log = structlog.get_logger()


@attrs.define(eq=False, kw_only=True)
class _Waiter:
    request: DecodeRequest
    wake: Wakeup = attrs.field(factory=Wakeup)


class HFSampler:
    """Generates with the policy's live weights (no sync needed after an update).

    Args:
        policy: the policy whose ``model`` and ``tokenizer`` generate.
        params: sampling parameters (temperature, top-p/k, repetition penalty, stop strings, seed).
        max_batch_size: most rows decoded together.
        max_wait_ms: how long an idle sampler waits for more requests before it starts a batch.
        prefix_cache_mb: memory for the KV of finished requests, reused when a later prompt extends one (the
            next turn of an episode prefills only the tool response); 0 turns it off. Cleared whenever the
            weights change.
        decode_forward: the decode step's forward (`mcprl_policy.config.DecodeForward`).
    """

    def __init__(
        self,
        policy: Policy,
        params: SamplingParams | None = None,
        *,
        max_batch_size: int = 64,
        max_wait_ms: float = 5.0,
        prefix_cache_mb: float = 0.0,
        decode_forward: DecodeForward = "auto",
    ) -> None:
        self._batcher = Batcher(max_batch_size=max_batch_size, max_wait_ms=max_wait_ms)
        if prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb must be >= 0, got {prefix_cache_mb}")
        self.policy = policy
        self.params = params if params is not None else SamplingParams()
        self.max_batch_size = max_batch_size
        tokenizer = policy.tokenizer
        self._tokenizer = tokenizer
        # Prompts may hold any id the model can embed; sampled ids stay below policy.vocab_limit.
        self._vocab_size = embedding_rows(policy.model)
        self.engine = DecodeEngine(
            policy.model,
            params=self.params,
            stop_token_ids=end_of_turn_ids(tokenizer, policy.model),
            pad_token_id=int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0),
            max_batch_size=max_batch_size,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True),
            prefix_cache_bytes=int(prefix_cache_mb * 2**20),
            vocab_limit=policy.vocab_limit,
            decode_forward=decode_forward,
        )
        self._waiters: dict[int, _Waiter] = {}

    def sync_weights(self) -> bool:
        """Nothing to do: generation reads the policy's live weights. Part of the samplers' common API.

        Returns:
            False: no weights are pushed.
        """
        return False

    def metrics(self) -> dict[str, float]:
        """Counters of the decode engine (forward passes, rows per pass, prefill tokens, prompt tokens copied
        from an identical prompt prefilled in the same admission instead of prefilled again), and
        ``sampler/kv_pool``: 1 when the running rows' cache is the preallocated pool, 0 when concatenated;
        ``sampler/lean_forward``: 1 when decode steps run the lean forward, 0 the model's."""
        s = self.engine.stats
        return {
            "sampler/prefill_calls": float(s.prefill_calls),
            "sampler/decode_calls": float(s.decode_calls),
            "sampler/prefill_tokens": float(s.prefill_tokens),
            "sampler/shared_prefill_tokens": float(s.shared_tokens),
            "sampler/decode_rows_mean": s.decode_rows / s.decode_calls if s.decode_calls else 0.0,
            "sampler/prefill_rows_mean": s.prefill_rows / s.prefill_calls if s.prefill_calls else 0.0,
            "sampler/max_rows": float(s.max_rows),
            "sampler/prefix_hits": float(s.prefix_hits),
            "sampler/prefix_reused_tokens": float(s.prefix_tokens),
            "sampler/kv_pool": float(s.kv_layout == "pool"),
            "sampler/lean_forward": float(s.decode_forward == "lean"),
        }

    async def sample(
        self, prompt_ids: Sequence[int], *, max_new_tokens: int, seed: int | None = None
    ) -> Completion:
        """Generate one continuation of ``prompt_ids`` (batched with concurrent calls).

        With ``seed`` the request draws from its own generator (seeded with it), so its tokens do not depend
        on the other requests in flight or their order; without, it draws from the engine's generator
        (seeded with ``params.seed``), shared with every unseeded request.

        The completion's ``queue_s`` is the time from this call until the engine admitted the request into its
        running batch (the batcher's wait for a fuller batch, and the wait for a free row when
        ``max_batch_size`` rows are running); its prefill and decode steps, shared with the batch, are not.

        Raises:
            SamplerError: empty prompt, ``max_new_tokens < 1``, an id outside the vocabulary, or a failure
                of the model while this request was in flight.
        """
        prompt = [int(t) for t in prompt_ids]
        self._validate(prompt, max_new_tokens, seed)
        request = DecodeRequest(prompt_ids=prompt, max_new_tokens=max_new_tokens, seed=seed)
        waiter = _Waiter(request=request)
        self._waiters[id(request)] = waiter

        def abandon() -> None:
            request.cancelled = True
            self._waiters.pop(id(request), None)

        self.engine.pending.append(request)
        self._batcher.queued(len(self.engine.pending))
        await self._batcher.serve(
            waiter.wake,
            finished=lambda: request.finished,
            drive=lambda: self._drive(request),
            hand_off=self._hand_off,
            abandon=abandon,
        )
        del self._waiters[id(request)]
        return self._completion(request)

    async def _drive(self, own: DecodeRequest) -> None:
        await self._batcher.gather(len(self.engine.pending), busy=bool(self.engine.active))
        while not own.finished:
            try:
                finished = await anyio.to_thread.run_sync(self._run_engine)
            except Exception as exc:
                _log.error("sampler_generation_failed", error=repr(exc))
                finished = self.engine.fail_all(SamplerError(f"generation failed: {exc!r}"))
            for request in finished:
                self._wake(request)
            if not finished and not own.finished:
                raise SamplerError("the decode engine went idle before this request finished")

    def _run_engine(self) -> list[DecodeRequest]:
        # Autocast and torch's thread count are per thread: set in the worker thread that runs the forwards.
        take_threads()
        with self.policy.autocast():
            return self.engine.run_until_finished()

    def _wake(self, request: DecodeRequest) -> None:
        waiter = self._waiters.get(id(request))
        if waiter is not None:
            waiter.wake.set()

    def _hand_off(self) -> None:
        """Wake one caller whose request still needs generating, so it takes over driving; else tidy up."""
        for request in (*self.engine.active, *self.engine.pending):
            if not request.cancelled and id(request) in self._waiters:
                self._wake(request)
                return
        self.engine.discard_cancelled()

    def _validate(self, prompt: list[int], max_new_tokens: int, seed: int | None) -> None:
        if not prompt:
            raise SamplerError("empty prompt")
        if max_new_tokens < 1:
            raise SamplerError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        if seed is not None and not 0 <= seed < 2**64:
            raise SamplerError(
                f"a request seed must be in [0, 2**64) (torch.Generator.manual_seed), got {seed}"
            )
        bad = [t for t in prompt if not 0 <= t < self._vocab_size]
        if bad:
            raise SamplerError(f"prompt ids outside the vocabulary (size {self._vocab_size}): {bad[:5]}")

    def _completion(self, request: DecodeRequest) -> Completion:
        if request.error is not None:
            raise SamplerError(str(request.error)) from request.error
        assert request.finish_reason is not None
        return Completion(
            token_ids=list(request.token_ids),
            logprobs=list(request.logprobs),
            text=self._tokenizer.decode(request.token_ids, skip_special_tokens=True),
            finish_reason=request.finish_reason,
            queue_s=request.queue_s,
        )
